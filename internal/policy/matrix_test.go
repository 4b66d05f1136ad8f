package policy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// TestL3AuthorizationMatrix runs callers × capabilities × risk levels R1–R5
// × data classes T1–T4 (and none) × policy sets (none, deny, allow, limits,
// overlap) through the real Gate, plus requested durations × active
// sessions for the limit-bearing sets, and compares every verdict with the
// hand-written oracle in matrix_oracle_test.go: admitted or not, the reason
// code of each refusal, the session's max duration, whether a concurrency
// limit bounds it, the assessed risk and the class the task was judged by.
func TestL3AuthorizationMatrix(t *testing.T) {
	now := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	var st matrixStats
	for _, g := range matrixGrids {
		cols, rows := parseMatrixGrid(t, g.grid)
		for _, set := range strings.Fields(g.sets) {
			for _, caller := range strings.Fields(g.callers) {
				for r, risk := range matrixRiskRows {
					for c, class := range cols {
						want := rows[r][c]
						name := fmt.Sprintf("%s/%s/%s/%s/%s", set, caller, g.capability, risk, class)
						tc := matrixCase{set: set, caller: caller, capability: g.capability, risk: risk, class: strings.Trim(class, "-"), want: want}
						st.check(t, name, now, tc)
					}
				}
			}
		}
	}
	for _, l := range matrixLoads {
		cols, rows := parseMatrixLoad(t, l.grid)
		for _, row := range rows {
			for c, active := range cols {
				name := fmt.Sprintf("%s/%s/%s/%s/%s/duration %s/active %s", l.set, l.caller, l.capability, l.risk, l.class, row.duration, active)
				tc := matrixCase{set: l.set, caller: l.caller, capability: l.capability, risk: l.risk, class: l.class,
					duration: strings.Trim(row.duration, "-"), active: active, want: row.cells[c]}
				st.check(t, name, now, tc)
			}
		}
	}
	for _, tc := range matrixCases {
		st.check(t, tc.name, now, tc)
	}

	// The matrix must stay a matrix: every reason the gate gives before the
	// harness is contacted is exercised, and denials are checked as much as
	// admissions.
	for _, code := range []string{"NA", "UC", "RX", "DC", "DU", "CL", "MF", "EX"} {
		if st.reasons[code] == 0 {
			t.Errorf("no case of the matrix is refused %s (%s)", code, matrixReasons[code])
		}
	}
	if st.cases < 1500 || st.denials < 1000 || st.cases-st.denials < 150 {
		t.Errorf("the matrix shrank: %d cases, %d denials", st.cases, st.denials)
	}
	var reasons []string
	for code, n := range st.reasons {
		reasons = append(reasons, fmt.Sprintf("%s %d", matrixReasons[code], n))
	}
	sort.Strings(reasons)
	t.Logf("L3 matrix: %d cases through Gate, %d admitted, %d denied (%s)", st.cases, st.cases-st.denials, st.denials, strings.Join(reasons, ", "))
}

type matrixSet struct {
	policies            []hcpv1alpha1.CapabilityPolicy
	calleeMaxConcurrent int32 // 0: none
}

type matrixGrid struct {
	sets, callers, capability string
	grid                      string
}

type matrixLoad struct {
	set, caller, capability, risk, class string
	grid                                 string
}

// matrixCase is one task and its expected verdict (a cell of the oracle).
type matrixCase struct {
	name, set, caller, capability string
	risk, class                   string // "" = not declared
	claim                         string // payload caller_id; "" = the caller's own id
	callee                        string // payload callee_id; "" = lab-cvd
	ceiling                       string // constraints.max_risk_level
	duration                      string // constraints.max_duration, ISO 8601
	deadline                      string // constraints.deadline, from now (Go duration)
	active                        string // "caller/callee" active sessions; "" = none
	want                          string // a cell: reason code or max duration[*]
	msg                           string // in the verdict's message
}

var matrixRiskRows = []string{"R1", "R2", "R3", "R4", "R5"}

var matrixReasons = map[string]task.ReasonCode{
	"NA": task.ReasonNotAuthorized,
	"UC": task.ReasonUnknownCapability,
	"RX": task.ReasonRiskExceedsPolicy,
	"DC": task.ReasonDataClassExceedsPolicy,
	"DU": task.ReasonDurationExceedsPolicy,
	"CL": task.ReasonConcurrencyLimit,
	"MF": task.ReasonMalformed,
	"EX": task.ReasonExpired,
}

// matrixCallers: alpha and beta have Caller objects, ext has none.
var matrixCallers = map[string]Caller{
	"alpha": {ID: "alpha", Labels: map[string]string{"team": "chem"}, Known: true},
	"beta":  {ID: "beta", Labels: map[string]string{"team": "bio"}, Known: true},
	"ext":   UnknownCaller("ext"),
}

// matrixCapabilities: base risk and highest class, as the oracle's header
// states them (not read back from the Callee).
var matrixCapabilities = map[string]struct{ base, class string }{
	"cvd.read-telemetry": {"R1", "T1"},
	"cvd.run-synthesis":  {"R3", "T2"},
	"cvd.calibrate":      {"R2", "T4"},
}

func matrixCallee(set matrixSet) *hcpv1alpha1.Callee {
	c := &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-cvd", Namespace: "lab", Labels: map[string]string{"site": "lab", "tier": "wet"}},
		Spec: hcpv1alpha1.CalleeSpec{
			Capabilities: []hcpv1alpha1.Capability{
				{Name: "cvd.read-telemetry", RiskLevel: hcpv1alpha1.RiskR1, DataClassification: hcpv1alpha1.DataT1},
				{Name: "cvd.run-synthesis", RiskLevel: hcpv1alpha1.RiskR3, DataClassification: hcpv1alpha1.DataT2, MaxDuration: "PT72H"},
				{Name: "cvd.calibrate", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT4, MaxDuration: "PT1H"},
			},
			Sessions: hcpv1alpha1.SessionsSpec{DefaultMaxDuration: "PT45M"},
		},
	}
	if set.calleeMaxConcurrent > 0 {
		c.Spec.Sessions.MaxConcurrent = ptr.To(set.calleeMaxConcurrent)
	}
	return c
}

type matrixStats struct {
	cases, denials int
	reasons        map[string]int
}

// check builds the task of tc, runs the Gate, and compares.
func (st *matrixStats) check(t *testing.T, name string, now time.Time, tc matrixCase) {
	t.Helper()
	set, ok := matrixPolicySets[tc.set]
	if !ok {
		t.Fatalf("%s: no policy set %q", name, tc.set)
	}
	caller, ok := matrixCallers[tc.caller]
	if !ok {
		t.Fatalf("%s: no caller %q", name, tc.caller)
	}
	ts := &task.TaskSubmit{
		CallerID:   caller.ID,
		CalleeID:   "lab-cvd",
		Capability: tc.capability,
		Intent:     "matrix",
		Inputs:     json.RawMessage(`{}`),
		Constraints: task.Constraints{
			DataClassification: task.DataClass(tc.class),
			MaxRiskLevel:       task.RiskLevel(tc.ceiling),
		},
	}
	if tc.claim != "" {
		ts.CallerID = tc.claim
	}
	if tc.callee != "" {
		ts.CalleeID = tc.callee
	}
	if tc.risk != "" {
		ts.Metadata = json.RawMessage(`{"risk_level":"` + tc.risk + `"}`)
	}
	if tc.duration != "" {
		d, err := task.ParseDuration(tc.duration)
		if err != nil {
			t.Fatalf("%s: duration %q: %v", name, tc.duration, err)
		}
		ts.Constraints.MaxDuration = task.Duration(d)
	}
	if tc.deadline != "" {
		d, err := time.ParseDuration(tc.deadline)
		if err != nil {
			t.Fatalf("%s: deadline %q: %v", name, tc.deadline, err)
		}
		ts.Constraints.Deadline = task.TimestampPtr(now.Add(d))
	}
	// What the decoder lets through: the gate never sees anything else.
	if err := ts.Validate(); err != nil {
		t.Fatalf("%s: the matrix built an invalid task_submit: %v", name, err)
	}
	var active Active
	if tc.active != "" {
		if _, err := fmt.Sscanf(tc.active, "%d/%d", &active.CallerOnCallee, &active.Callee); err != nil {
			t.Fatalf("%s: active %q: %v", name, tc.active, err)
		}
	}

	v := Gate(GateInput{Now: now, Callee: matrixCallee(set), Caller: caller, Policies: set.policies, Active: active, Task: ts})

	st.cases++
	if st.reasons == nil {
		st.reasons = map[string]int{}
	}
	if tc.msg != "" && !strings.Contains(v.Message, tc.msg) {
		t.Errorf("%s: message %q does not contain %q", name, v.Message, tc.msg)
	}
	if v.Message == "" {
		t.Errorf("%s: verdict without a message: %+v", name, v)
	}
	capab, known := matrixCapabilities[tc.capability]
	wantRisk := ""
	if known {
		wantRisk = capab.base
		if tc.risk != "" && task.RiskLevel(capab.base).Less(task.RiskLevel(tc.risk)) {
			wantRisk = tc.risk
		}
	}
	if reason, denied := matrixReasons[tc.want]; denied {
		st.denials++
		st.reasons[tc.want]++
		if v.Admitted || v.Reason != reason {
			t.Errorf("%s: got %s, want refused %s", name, verdictString(v), reason)
			return
		}
		if v.MaxDuration != 0 {
			t.Errorf("%s: a refusal carries a max duration %s", name, v.MaxDuration)
		}
		// Refusals after the capability was found report the assessment.
		if known && tc.claim == "" && tc.callee == "" && string(v.Risk) != wantRisk {
			t.Errorf("%s: refused at risk %q, want %q", name, v.Risk, wantRisk)
		}
		return
	}
	want, counted := strings.CutSuffix(tc.want, "*")
	wantDur, err := time.ParseDuration(want)
	if err != nil {
		t.Fatalf("%s: oracle cell %q is neither a reason nor a duration", name, tc.want)
	}
	if !v.Admitted {
		t.Errorf("%s: got %s, want admitted for %s", name, verdictString(v), tc.want)
		return
	}
	if v.MaxDuration != wantDur || v.Counted != counted {
		t.Errorf("%s: admitted for %s (counted %v), want %s (counted %v)", name, v.MaxDuration, v.Counted, wantDur, counted)
	}
	if string(v.Risk) != wantRisk {
		t.Errorf("%s: admitted at risk %q, want %q", name, v.Risk, wantRisk)
	}
	wantClass := tc.class
	if wantClass == "" {
		wantClass = capab.class
	}
	if string(v.DataClass) != wantClass {
		t.Errorf("%s: judged as class %q, want %q", name, v.DataClass, wantClass)
	}
}

func verdictString(v Verdict) string {
	if v.Admitted {
		return fmt.Sprintf("admitted for %s (counted %v, risk %s)", v.MaxDuration, v.Counted, v.Risk)
	}
	return fmt.Sprintf("refused %s: %s", v.Reason, v.Message)
}

// parseMatrixGrid reads a risk × class grid: a header of classes, then the
// rows R1..R5 in order.
func parseMatrixGrid(t *testing.T, grid string) (cols []string, rows [][]string) {
	t.Helper()
	lines := matrixLines(grid)
	cols = lines[0]
	if strings.Join(cols, " ") != "T1 T2 T3 T4 --" {
		t.Fatalf("grid header %v, want T1 T2 T3 T4 --", cols)
	}
	if len(lines) != 1+len(matrixRiskRows) {
		t.Fatalf("grid with %d rows, want %d:%s", len(lines)-1, len(matrixRiskRows), grid)
	}
	for i, l := range lines[1:] {
		if l[0] != matrixRiskRows[i] || len(l) != 1+len(cols) {
			t.Fatalf("grid row %v: want %s and %d cells", l, matrixRiskRows[i], len(cols))
		}
		rows = append(rows, l[1:])
	}
	return cols, rows
}

type matrixLoadRow struct {
	duration string
	cells    []string
}

// parseMatrixLoad reads a duration × active grid: a header of
// "caller/callee" counts, then one row per requested duration.
func parseMatrixLoad(t *testing.T, grid string) (cols []string, rows []matrixLoadRow) {
	t.Helper()
	lines := matrixLines(grid)
	cols = lines[0]
	for _, c := range cols {
		a, b, ok := strings.Cut(c, "/")
		if _, err := strconv.Atoi(a); !ok || err != nil {
			t.Fatalf("load header %q is not caller/callee", c)
		}
		if _, err := strconv.Atoi(b); err != nil {
			t.Fatalf("load header %q is not caller/callee", c)
		}
	}
	for _, l := range lines[1:] {
		if len(l) != 1+len(cols) {
			t.Fatalf("load row %v: want %d cells", l, len(cols))
		}
		rows = append(rows, matrixLoadRow{duration: l[0], cells: l[1:]})
	}
	return cols, rows
}

func matrixLines(grid string) [][]string {
	var out [][]string
	for _, l := range strings.Split(grid, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Fixture builders for the oracle's policy sets, beside decide_test.go's
// pol, rule, callerSel, classes, maxDur and maxConc.

func mxPolicyIn(namespace, name string, callees map[string]string, rules ...hcpv1alpha1.PolicyRule) hcpv1alpha1.CapabilityPolicy {
	p := pol(name, callees, rules...)
	p.Namespace = namespace
	return p
}

func mxBrokenSelectorPolicy(name string, rules ...hcpv1alpha1.PolicyRule) hcpv1alpha1.CapabilityPolicy {
	p := pol(name, nil, rules...)
	p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "site", Operator: "Bogus", Values: []string{"lab"}}}
	return p
}

func mxSelector(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}
