package task

import (
	"slices"
	"testing"
)

func TestRiskLevelParseAndOrder(t *testing.T) {
	for i, r := range RiskLevels() {
		got, err := ParseRiskLevel(string(r))
		if err != nil || got != r {
			t.Fatalf("ParseRiskLevel(%q) = %q, %v", r, got, err)
		}
		for j, o := range RiskLevels() {
			if got, want := r.Less(o), i < j; got != want {
				t.Errorf("%s.Less(%s) = %v, want %v", r, o, got, want)
			}
			if got, want := r.Compare(o), cmpInt(i, j); got != want {
				t.Errorf("%s.Compare(%s) = %d, want %d", r, o, got, want)
			}
			want := r
			if i < j {
				want = o
			}
			if got := r.Max(o); got != want {
				t.Errorf("%s.Max(%s) = %s, want %s", r, o, got, want)
			}
		}
	}
	for _, bad := range []string{"", "r1", "R0", "R6", "R", " R1", "R1 ", "T1"} {
		if _, err := ParseRiskLevel(bad); err == nil {
			t.Errorf("ParseRiskLevel(%q) succeeded", bad)
		}
		if RiskLevel(bad).Valid() {
			t.Errorf("RiskLevel(%q).Valid() = true", bad)
		}
	}
	if got := MaxRiskLevel(R2, R5, R1); got != R5 {
		t.Errorf("MaxRiskLevel = %s", got)
	}
	if got := MaxRiskLevel(); got != "" {
		t.Errorf("MaxRiskLevel() = %q", got)
	}
	if !RiskLevel("bogus").Less(R1) {
		t.Error("invalid level must sort below R1")
	}
}

func TestDataClassParseAndOrder(t *testing.T) {
	for i, c := range DataClasses() {
		got, err := ParseDataClass(string(c))
		if err != nil || got != c {
			t.Fatalf("ParseDataClass(%q) = %q, %v", c, got, err)
		}
		for j, o := range DataClasses() {
			if got, want := c.Less(o), i < j; got != want {
				t.Errorf("%s.Less(%s) = %v, want %v", c, o, got, want)
			}
			if got, want := c.Compare(o), cmpInt(i, j); got != want {
				t.Errorf("%s.Compare(%s) = %d, want %d", c, o, got, want)
			}
		}
	}
	for _, bad := range []string{"", "t1", "T0", "T5", "R1"} {
		if _, err := ParseDataClass(bad); err == nil {
			t.Errorf("ParseDataClass(%q) succeeded", bad)
		}
	}
	if got := MaxDataClass(T3, T1, T2); got != T3 {
		t.Errorf("MaxDataClass = %s", got)
	}
	if got := T4.Max(T1); got != T4 {
		t.Errorf("T4.Max(T1) = %s", got)
	}
}

func TestReasonCodes(t *testing.T) {
	want := []ReasonCode{"malformed", "expired", "not_authorized", "unknown_capability",
		"risk_exceeds_policy", "data_class_exceeds_policy", "duration_exceeds_policy",
		"concurrency_limit", "harness_unavailable", "internal"}
	if got := ReasonCodes(); !slices.Equal(got, want) {
		t.Fatalf("ReasonCodes() = %v, want %v", got, want)
	}
	for _, r := range want {
		if !r.Valid() {
			t.Errorf("%s.Valid() = false", r)
		}
	}
	for _, bad := range []ReasonCode{"", "duplicate", "MALFORMED"} {
		if bad.Valid() {
			t.Errorf("%q.Valid() = true", bad)
		}
	}
}
