package policy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// The oracle of TestL3AuthorizationMatrix, written by hand from the L3
// design (/work/shared/design/DESIGN.md section 4), docs/policy.md and
// docs/security.md's gate table. Nothing here is computed: every cell was
// worked out on paper from the fixtures below, and the test only parses the
// grids and compares them with what the real Gate says.
//
// The fixtures. Callee lab-cvd (namespace lab, labels site=lab, tier=wet,
// spec.sessions.defaultMaxDuration PT45M) offers:
//
//	cvd.read-telemetry  base R1, up to T1, no maxDuration
//	cvd.run-synthesis   base R3, up to T2, maxDuration PT72H
//	cvd.calibrate       base R2, up to T4, maxDuration PT1H
//
// and not cvd.teleport. Callers: alpha (a Caller object labelled
// team=chem), beta (a Caller object labelled team=bio), ext (no Caller
// object in the namespace: an external program).
//
// A task asks for a risk in metadata.risk_level (the rows R1..R5; the
// assessed risk is never below the capability's base) and a data class in
// constraints.data_classification (the columns T1..T4; "--" leaves it out,
// so the task is judged as the capability's class). Unless a grid says
// otherwise the task names no max_duration and the caller has no session
// running.
//
// A cell is either a rejection's reason code
//
//	NA not_authorized          UC unknown_capability
//	RX risk_exceeds_policy     DC data_class_exceeds_policy
//	DU duration_exceeds_policy CL concurrency_limit
//	MF malformed               EX expired
//
// or an admission, written as the session's max duration ("45m", "72h"),
// with a trailing "*" when a concurrency limit bounds it (Verdict.Counted:
// the admission must then be recounted across replicas).
//
// Where a cell's reasoning is not obvious, a comment beside the grid says
// which rule decided it.

// matrixPolicySets are the policy sets, by name.
var matrixPolicySets = map[string]matrixSet{
	// No CapabilityPolicy at all: default deny.
	"none": {},

	// Policies that exist but admit none of alpha, beta, ext to any
	// capability of lab-cvd: another caller, capabilities that do not
	// match, another callee, another namespace, and broken policies that
	// must fail closed.
	"deny": {policies: []hcpv1alpha1.CapabilityPolicy{
		pol("other-callers", map[string]string{"site": "lab"},
			rule("gamma-only", []string{"gamma"}, []string{"*"}, "R5")),
		pol("other-capabilities", nil,
			rule("chem-bio", nil, []string{"bio.*"}, "R5", callerSel(mxSelector("team", "chem"))),
			// Exact names, no wildcard: "cvd.read" is not cvd.read-telemetry.
			rule("near-misses", []string{"*"}, []string{"cvd.read", "calibrate", "cvd.run-synthesis.v2"}, "R5")),
		pol("elsewhere", map[string]string{"site": "elsewhere"},
			rule("everyone", []string{"*"}, []string{"*"}, "R5")),
		mxPolicyIn("other", "other-namespace", nil,
			rule("everyone", []string{"*"}, []string{"*"}, "R5")),
		// A calleeSelector the API server accepts but labels cannot parse:
		// the policy selects nothing.
		mxBrokenSelectorPolicy("broken-selector",
			rule("everyone", []string{"*"}, []string{"*"}, "R5")),
		pol("broken-rules", nil,
			// An invalid callers.selector disables the rule, ids included.
			rule("bad-caller-selector", []string{"*"}, []string{"*"}, "R5", callerSel(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Bogus"}}})),
			// A zero maxDuration admits no task.
			rule("zero-duration", []string{"*"}, []string{"*"}, "R5", maxDur("PT0S"))),
	}},

	// Grants: alpha by label, ext by id for telemetry, beta by id for
	// synthesis, and every Caller object (an empty selector) for
	// calibration, which never reaches ext, which has none.
	"allow": {policies: []hcpv1alpha1.CapabilityPolicy{
		pol("lab", map[string]string{"site": "lab"},
			rule("chem", nil, []string{"cvd.*"}, "R4", callerSel(mxSelector("team", "chem"))),
			rule("ext-telemetry", []string{"ext"}, []string{"*.read-*"}, "R2", classes("T1")),
			rule("beta-synthesis", []string{"beta"}, []string{"cvd.run-synthesis"}, "R3", classes("T2"), maxDur("PT4H")),
			rule("known-calibrate", nil, []string{"cvd.calibrate"}, "R2", callerSel(&metav1.LabelSelector{}), classes("T4"))),
	}},

	// Limits on duration and concurrency, and a Callee-wide cap of 3.
	"limits": {calleeMaxConcurrent: 3, policies: []hcpv1alpha1.CapabilityPolicy{
		pol("limits", nil,
			rule("alpha-limited", []string{"alpha"}, []string{"cvd.*"}, "R5", maxDur("PT2H"), maxConc(2)),
			rule("beta-limited", []string{"beta"}, []string{"cvd.run-synthesis"}, "R3", maxDur("PT90M"), maxConc(1))),
	}},

	// Several policies overlapping on the same tasks (docs/policy.md,
	// "Several rules"): one must admit entirely, the tightest limits of
	// those that admit apply, and a refusal reports the rule that came
	// closest (ties: the first by policy name).
	"overlap": {policies: []hcpv1alpha1.CapabilityPolicy{
		pol("a-everyone", nil,
			rule("everyone", []string{"*"}, []string{"cvd.*"}, "R3", classes("T1"), maxDur("PT24H"))),
		pol("b-alpha", map[string]string{"site": "lab"},
			rule("alpha-synthesis", []string{"alpha"}, []string{"cvd.run-synthesis"}, "R3", maxDur("PT48H"), maxConc(1))),
		pol("c-chem", map[string]string{"tier": "wet"},
			rule("chem-high", nil, []string{"cvd.calibrate", "cvd.run-*"}, "R5", callerSel(mxSelector("team", "chem")), classes("T3", "T4"), maxDur("PT30M"))),
		pol("d-elsewhere", map[string]string{"site": "elsewhere"},
			rule("everything", []string{"*"}, []string{"*"}, "R5")),
	}},
}

// matrixGrids: risk × data class, per policy set, caller and capability.
var matrixGrids = []matrixGrid{
	// An unknown capability is refused first, whatever the policies.
	{sets: "none deny allow limits overlap", callers: "alpha beta ext", capability: "cvd.teleport", grid: `
		   T1  T2  T3  T4  --
		R1 UC  UC  UC  UC  UC
		R2 UC  UC  UC  UC  UC
		R3 UC  UC  UC  UC  UC
		R4 UC  UC  UC  UC  UC
		R5 UC  UC  UC  UC  UC`},

	// Default deny; a class above the capability's is refused before any
	// policy is read, so it says DC, not NA.
	{sets: "none deny", callers: "alpha beta ext", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 NA  DC  DC  DC  NA
		R2 NA  DC  DC  DC  NA
		R3 NA  DC  DC  DC  NA
		R4 NA  DC  DC  DC  NA
		R5 NA  DC  DC  DC  NA`},
	{sets: "none deny", callers: "alpha beta ext", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 NA  NA  DC  DC  NA
		R2 NA  NA  DC  DC  NA
		R3 NA  NA  DC  DC  NA
		R4 NA  NA  DC  DC  NA
		R5 NA  NA  DC  DC  NA`},
	{sets: "none deny", callers: "alpha beta ext", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 NA  NA  NA  NA  NA
		R2 NA  NA  NA  NA  NA
		R3 NA  NA  NA  NA  NA
		R4 NA  NA  NA  NA  NA
		R5 NA  NA  NA  NA  NA`},

	// allow, alpha: rule chem (selector team=chem, cvd.*, up to R4, every
	// class, no duration): the session gets the capability's maxDuration,
	// or the Callee's default 45m when the capability has none.
	{sets: "allow", callers: "alpha", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 45m DC  DC  DC  45m
		R2 45m DC  DC  DC  45m
		R3 45m DC  DC  DC  45m
		R4 45m DC  DC  DC  45m
		R5 RX  DC  DC  DC  RX`},
	// Base R3: rows R1..R3 are all assessed R3.
	{sets: "allow", callers: "alpha", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 72h 72h DC  DC  72h
		R2 72h 72h DC  DC  72h
		R3 72h 72h DC  DC  72h
		R4 72h 72h DC  DC  72h
		R5 RX  RX  DC  DC  RX`},
	// chem and known-calibrate (R2, T4) both admit R1/R2 at T4; chem alone
	// the rest up to R4; both refuse R5 for risk.
	{sets: "allow", callers: "alpha", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 1h  1h  1h  1h  1h
		R2 1h  1h  1h  1h  1h
		R3 1h  1h  1h  1h  1h
		R4 1h  1h  1h  1h  1h
		R5 RX  RX  RX  RX  RX`},

	// allow, beta (team=bio): chem's selector misses it.
	{sets: "allow", callers: "beta", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 NA  DC  DC  DC  NA
		R2 NA  DC  DC  DC  NA
		R3 NA  DC  DC  DC  NA
		R4 NA  DC  DC  DC  NA
		R5 NA  DC  DC  DC  NA`},
	// beta-synthesis: R3, T2 only, PT4H. Risk is checked before class, so
	// R4/R5 at T1 say RX; "--" is judged T2.
	{sets: "allow", callers: "beta", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 DC  4h  DC  DC  4h
		R2 DC  4h  DC  DC  4h
		R3 DC  4h  DC  DC  4h
		R4 RX  RX  DC  DC  RX
		R5 RX  RX  DC  DC  RX`},
	// known-calibrate: the empty selector matches beta's Caller object.
	{sets: "allow", callers: "beta", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 DC  DC  DC  1h  1h
		R2 DC  DC  DC  1h  1h
		R3 RX  RX  RX  RX  RX
		R4 RX  RX  RX  RX  RX
		R5 RX  RX  RX  RX  RX`},

	// allow, ext: ext-telemetry (by id, *.read-*, R2, T1).
	{sets: "allow", callers: "ext", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 45m DC  DC  DC  45m
		R2 45m DC  DC  DC  45m
		R3 RX  DC  DC  DC  RX
		R4 RX  DC  DC  DC  RX
		R5 RX  DC  DC  DC  RX`},
	{sets: "allow limits", callers: "ext", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 NA  NA  DC  DC  NA
		R2 NA  NA  DC  DC  NA
		R3 NA  NA  DC  DC  NA
		R4 NA  NA  DC  DC  NA
		R5 NA  NA  DC  DC  NA`},
	// Selectors, even the empty one of known-calibrate, never match a
	// caller without a Caller object.
	{sets: "allow limits", callers: "ext", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 NA  NA  NA  NA  NA
		R2 NA  NA  NA  NA  NA
		R3 NA  NA  NA  NA  NA
		R4 NA  NA  NA  NA  NA
		R5 NA  NA  NA  NA  NA`},

	// limits: the Callee-wide cap makes every admission counted.
	// alpha-limited: R5, PT2H, 2 at a time; the capability's 1h is tighter
	// for calibration.
	{sets: "limits", callers: "alpha", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 2h* DC  DC  DC  2h*
		R2 2h* DC  DC  DC  2h*
		R3 2h* DC  DC  DC  2h*
		R4 2h* DC  DC  DC  2h*
		R5 2h* DC  DC  DC  2h*`},
	{sets: "limits", callers: "alpha", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 2h* 2h* DC  DC  2h*
		R2 2h* 2h* DC  DC  2h*
		R3 2h* 2h* DC  DC  2h*
		R4 2h* 2h* DC  DC  2h*
		R5 2h* 2h* DC  DC  2h*`},
	{sets: "limits", callers: "alpha", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 1h* 1h* 1h* 1h* 1h*
		R2 1h* 1h* 1h* 1h* 1h*
		R3 1h* 1h* 1h* 1h* 1h*
		R4 1h* 1h* 1h* 1h* 1h*
		R5 1h* 1h* 1h* 1h* 1h*`},
	{sets: "limits", callers: "beta ext", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 NA  DC  DC  DC  NA
		R2 NA  DC  DC  DC  NA
		R3 NA  DC  DC  DC  NA
		R4 NA  DC  DC  DC  NA
		R5 NA  DC  DC  DC  NA`},
	// beta-limited: R3, PT90M, 1 at a time.
	{sets: "limits", callers: "beta", capability: "cvd.run-synthesis", grid: `
		   T1   T2   T3  T4  --
		R1 90m* 90m* DC  DC  90m*
		R2 90m* 90m* DC  DC  90m*
		R3 90m* 90m* DC  DC  90m*
		R4 RX   RX   DC  DC  RX
		R5 RX   RX   DC  DC  RX`},
	{sets: "limits", callers: "beta", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 NA  NA  NA  NA  NA
		R2 NA  NA  NA  NA  NA
		R3 NA  NA  NA  NA  NA
		R4 NA  NA  NA  NA  NA
		R5 NA  NA  NA  NA  NA`},

	// overlap, alpha. Telemetry: a-everyone only (c-chem's patterns miss it).
	{sets: "overlap", callers: "alpha", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 24h DC  DC  DC  24h
		R2 24h DC  DC  DC  24h
		R3 24h DC  DC  DC  24h
		R4 RX  DC  DC  DC  RX
		R5 RX  DC  DC  DC  RX`},
	// T1: a-everyone and b-alpha admit, tightest 24h, b-alpha's limit of 1
	// makes it counted. T2 ("--" too): b-alpha alone, 48h. R4/R5: a and b
	// fail at risk, c-chem (R5) gets further, to the class: DC even at T1,
	// a class a-everyone allows.
	{sets: "overlap", callers: "alpha", capability: "cvd.run-synthesis", grid: `
		   T1   T2   T3  T4  --
		R1 24h* 48h* DC  DC  48h*
		R2 24h* 48h* DC  DC  48h*
		R3 24h* 48h* DC  DC  48h*
		R4 DC   DC   DC  DC  DC
		R5 DC   DC   DC  DC  DC`},
	// T1: a-everyone (capability 1h is tighter than 24h). T3/T4 ("--" is
	// T4): c-chem, 30m. T2: both fail at the class. R4/R5 T1: a-everyone
	// fails at risk, c-chem at the class, which is further.
	{sets: "overlap", callers: "alpha", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 1h  DC  30m 30m 30m
		R2 1h  DC  30m 30m 30m
		R3 1h  DC  30m 30m 30m
		R4 DC  DC  30m 30m 30m
		R5 DC  DC  30m 30m 30m`},
	// overlap, beta and ext: a-everyone only ("*" names both; c-chem's
	// selector matches neither).
	{sets: "overlap", callers: "beta ext", capability: "cvd.read-telemetry", grid: `
		   T1  T2  T3  T4  --
		R1 24h DC  DC  DC  24h
		R2 24h DC  DC  DC  24h
		R3 24h DC  DC  DC  24h
		R4 RX  DC  DC  DC  RX
		R5 RX  DC  DC  DC  RX`},
	{sets: "overlap", callers: "beta ext", capability: "cvd.run-synthesis", grid: `
		   T1  T2  T3  T4  --
		R1 24h DC  DC  DC  DC
		R2 24h DC  DC  DC  DC
		R3 24h DC  DC  DC  DC
		R4 RX  RX  DC  DC  RX
		R5 RX  RX  DC  DC  RX`},
	{sets: "overlap", callers: "beta ext", capability: "cvd.calibrate", grid: `
		   T1  T2  T3  T4  --
		R1 1h  DC  DC  DC  DC
		R2 1h  DC  DC  DC  DC
		R3 1h  DC  DC  DC  DC
		R4 RX  RX  RX  RX  RX
		R5 RX  RX  RX  RX  RX`},
}

// matrixLoads: requested max_duration (rows; "--" names none) × active
// sessions (columns: the caller's on the Callee / every caller's on it),
// for one caller, capability, risk and class.
var matrixLoads = []matrixLoad{
	// alpha-limited: PT2H, 2 at a time; Callee cap 3. Duration is checked
	// before concurrency, so PT3H says DU even when full; PT80H is above
	// the capability's PT72H, refused before any policy.
	{set: "limits", caller: "alpha", capability: "cvd.run-synthesis", risk: "R3", class: "T2", grid: `
		      0/0 1/1 1/2 2/2 1/3 0/3
		--    2h* 2h* 2h* CL  CL  CL
		PT1H  1h* 1h* 1h* CL  CL  CL
		PT2H  2h* 2h* 2h* CL  CL  CL
		PT3H  DU  DU  DU  DU  DU  DU
		PT80H DU  DU  DU  DU  DU  DU`},
	// beta-limited: PT90M, 1 at a time.
	{set: "limits", caller: "beta", capability: "cvd.run-synthesis", risk: "R3", class: "T2", grid: `
		      0/0  1/1 1/2 2/2 1/3 0/3
		--    90m* CL  CL  CL  CL  CL
		PT1H  1h*  CL  CL  CL  CL  CL
		PT2H  DU   DU  DU  DU  DU  DU
		PT80H DU   DU  DU  DU  DU  DU`},
	// T1: a-everyone (24h, no concurrency limit) and b-alpha (48h, 1 at a
	// time). With none running both admit and the tightest limits bind
	// (b-alpha's 1 makes it counted); with one running a-everyone alone
	// admits up to 24h, uncounted; above 24h only b-alpha could, and it is
	// full (CL); above 48h both refuse the duration.
	{set: "overlap", caller: "alpha", capability: "cvd.run-synthesis", risk: "R3", class: "T1", grid: `
		      0/0  1/1
		--    24h* 24h
		PT12H 12h* 12h
		PT24H 24h* 24h
		PT36H 36h* CL
		PT48H 48h* CL
		PT60H DU   DU
		PT80H DU   DU`},
	// T2: a-everyone refuses the class, so b-alpha decides alone.
	{set: "overlap", caller: "alpha", capability: "cvd.run-synthesis", risk: "R3", class: "T2", grid: `
		      0/0  1/1
		--    48h* CL
		PT12H 12h* CL
		PT36H 36h* CL
		PT48H 48h* CL
		PT60H DU   DU
		PT80H DU   DU`},
}

// matrixCases are single tasks for the Gate's own steps around the policy
// decision, and the messages that tell a caller which rule decided.
var matrixCases = []matrixCase{
	{name: "caller_id claims another caller than the broker authenticated", set: "allow", caller: "alpha", claim: "beta", capability: "cvd.read-telemetry", class: "T1",
		want: "NA", msg: "does not match the authenticated sender"},
	{name: "callee_id names another callee", set: "allow", caller: "alpha", callee: "lab-other", capability: "cvd.read-telemetry", class: "T1",
		want: "MF", msg: `callee_id "lab-other"`},
	{name: "assessed risk above the task's own max_risk_level", set: "allow", caller: "alpha", capability: "cvd.run-synthesis", risk: "R1", class: "T1", ceiling: "R2",
		want: "RX", msg: "constraints.max_risk_level R2"},
	{name: "assessed risk at the task's own max_risk_level", set: "allow", caller: "alpha", capability: "cvd.run-synthesis", class: "T1", ceiling: "R3",
		want: "72h"},
	{name: "a deadline shortens the session", set: "allow", caller: "alpha", capability: "cvd.read-telemetry", class: "T1", deadline: "10m",
		want: "10m"},
	{name: "a deadline under a second away", set: "allow", caller: "alpha", capability: "cvd.read-telemetry", class: "T1", deadline: "500ms",
		want: "EX"},
	{name: "a duration no rule or capability limits is granted as asked", set: "allow", caller: "alpha", capability: "cvd.read-telemetry", class: "T1", duration: "PT100H",
		want: "100h"},
	{name: "the task's duration above the capability's", set: "allow", caller: "alpha", capability: "cvd.run-synthesis", class: "T1", duration: "PT80H",
		want: "DU", msg: `maxDuration PT72H of capability "cvd.run-synthesis"`},
	{name: "no policy selects the callee", set: "none", caller: "alpha", capability: "cvd.calibrate", class: "T4",
		want: "NA", msg: `no CapabilityPolicy selects callee "lab-cvd"`},
	{name: "broken policies are named in a default deny", set: "deny", caller: "alpha", capability: "cvd.calibrate", class: "T4",
		want: "NA", msg: "is invalid in part and ignored there"},
	{name: "a caller without a Caller object is told selectors do not reach it", set: "allow", caller: "ext", capability: "cvd.calibrate", class: "T4",
		want: "NA", msg: "no Caller object in the namespace"},
	{name: "a refusal for risk names the rule", set: "allow", caller: "beta", capability: "cvd.run-synthesis", risk: "R4",
		want: "RX", msg: `rule "beta-synthesis"`},
	{name: "an omitted class refused by a rule says it was implied", set: "overlap", caller: "beta", capability: "cvd.calibrate",
		want: "DC", msg: "it is judged as T4, the class of capability"},
	{name: "the rule that came closest names the refusal", set: "overlap", caller: "alpha", capability: "cvd.run-synthesis", risk: "R5", class: "T1",
		want: "DC", msg: `rule "chem-high" of CapabilityPolicy "c-chem"`},
	{name: "a tie goes to the first policy by name", set: "overlap", caller: "alpha", capability: "cvd.run-synthesis", class: "T1", duration: "PT60H",
		want: "DU", msg: `CapabilityPolicy "a-everyone"`},
	{name: "a rule's concurrency limit is named", set: "limits", caller: "alpha", capability: "cvd.run-synthesis", class: "T2", active: "2/2",
		want: "CL", msg: `the maxConcurrentSessions of rule "alpha-limited" of CapabilityPolicy "limits" is 2`},
	{name: "the Callee's cap is named", set: "limits", caller: "alpha", capability: "cvd.run-synthesis", class: "T2", active: "1/3",
		want: "CL", msg: "spec.sessions.maxConcurrent is 3"},
	{name: "an admission by several rules names them all", set: "overlap", caller: "alpha", capability: "cvd.run-synthesis", class: "T1",
		want: "24h*", msg: `also admitted by b-alpha/alpha-synthesis`},
}
