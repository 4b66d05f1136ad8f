package conformance

import "fmt"

// recorder collects the results by check id for one catalog and profile.
// A failure sticks: a later pass does not hide it.
type recorder struct {
	catalog []Check
	profile string
	res     map[string]Row
}

func newRecorder() *recorder { return newRecorderFor(calleeChecks, ProfileHCPOperator) }

func newRecorderFor(catalog []Check, profile string) *recorder {
	if profile == "" {
		profile = ProfileSpec
	}
	return &recorder{catalog: catalog, profile: profile, res: map[string]Row{}}
}

// on reports whether a check runs in this recorder's profile.
func (r *recorder) on(id string) bool {
	for _, c := range r.catalog {
		if c.ID == id {
			return inProfile(c, r.profile)
		}
	}
	return false
}

func (r *recorder) set(id string, res Result, format string, args ...any) {
	if old, ok := r.res[id]; ok && old.Result == Fail {
		return
	}
	r.res[id] = Row{Result: res, Detail: fmt.Sprintf(format, args...)}
}

func (r *recorder) pass(id, format string, args ...any) { r.set(id, Pass, format, args...) }
func (r *recorder) fail(id, format string, args ...any) { r.set(id, Fail, format, args...) }
func (r *recorder) skip(id, why string)                 { r.set(id, Skip, "%s", why) }

// failRest fails every check without a result yet.
func (r *recorder) failRest(format string, args ...any) {
	for _, c := range r.catalog {
		if _, ok := r.res[c.ID]; !ok {
			r.fail(c.ID, format, args...)
		}
	}
}

// report returns one row per check of the profile, in catalog order; a
// check of the profile without a result fails ("not evaluated").
func (r *recorder) report() Report {
	rep := Report{Profile: r.profile, Rows: make([]Row, 0, len(r.catalog))}
	for _, c := range r.catalog {
		if !inProfile(c, r.profile) {
			continue
		}
		row, ok := r.res[c.ID]
		if !ok {
			row = Row{Result: Fail, Detail: "not evaluated"}
		}
		row.ID, row.Ref, row.Statement, row.Level, row.Profile, row.Cite = c.ID, c.Ref, c.Statement, c.Level, c.Profile, c.Cite()
		rep.Rows = append(rep.Rows, row)
	}
	return rep
}
