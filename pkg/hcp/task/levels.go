package task

import (
	"fmt"
	"strings"
)

// RiskLevel is the L3 risk classification of a task, from R1 (lowest) to R5
// (highest). The zero value is not a valid level.
type RiskLevel string

// Risk levels, in increasing order.
const (
	R1 RiskLevel = "R1"
	R2 RiskLevel = "R2"
	R3 RiskLevel = "R3"
	R4 RiskLevel = "R4"
	R5 RiskLevel = "R5"
)

// RiskLevels returns all risk levels in increasing order.
func RiskLevels() []RiskLevel { return []RiskLevel{R1, R2, R3, R4, R5} }

// ParseRiskLevel parses "R1".."R5". Matching is exact (case-sensitive), as
// on the wire.
func ParseRiskLevel(s string) (RiskLevel, error) {
	r := RiskLevel(s)
	if !r.Valid() {
		return "", fmt.Errorf("invalid risk level %q: want one of %s", s, joinLevels(RiskLevels()))
	}
	return r, nil
}

// Valid reports whether r is one of R1..R5.
func (r RiskLevel) Valid() bool { return r.rank() > 0 }

// rank returns 1..5 for R1..R5 and 0 for anything else.
func (r RiskLevel) rank() int {
	switch r {
	case R1:
		return 1
	case R2:
		return 2
	case R3:
		return 3
	case R4:
		return 4
	case R5:
		return 5
	}
	return 0
}

// Compare returns -1, 0 or +1 as r is lower than, equal to or higher than o.
// Invalid levels sort below R1.
func (r RiskLevel) Compare(o RiskLevel) int { return cmpInt(r.rank(), o.rank()) }

// Less reports whether r is a strictly lower risk than o.
func (r RiskLevel) Less(o RiskLevel) bool { return r.rank() < o.rank() }

// Max returns the higher of r and o.
func (r RiskLevel) Max(o RiskLevel) RiskLevel {
	if r.Less(o) {
		return o
	}
	return r
}

// MaxRiskLevel returns the highest of the given levels, or "" when none is
// given.
func MaxRiskLevel(levels ...RiskLevel) RiskLevel {
	var m RiskLevel
	for _, l := range levels {
		m = m.Max(l)
	}
	return m
}

// DataClass is the L3 sensitivity classification of the data a task
// handles, from T1 (least sensitive) to T4 (most sensitive). The zero value
// is not a valid class.
type DataClass string

// Data classes, in increasing order of sensitivity.
const (
	T1 DataClass = "T1"
	T2 DataClass = "T2"
	T3 DataClass = "T3"
	T4 DataClass = "T4"
)

// DataClasses returns all data classes in increasing order.
func DataClasses() []DataClass { return []DataClass{T1, T2, T3, T4} }

// ParseDataClass parses "T1".."T4" (exact, case-sensitive).
func ParseDataClass(s string) (DataClass, error) {
	c := DataClass(s)
	if !c.Valid() {
		return "", fmt.Errorf("invalid data classification %q: want one of %s", s, joinLevels(DataClasses()))
	}
	return c, nil
}

// Valid reports whether c is one of T1..T4.
func (c DataClass) Valid() bool { return c.rank() > 0 }

func (c DataClass) rank() int {
	switch c {
	case T1:
		return 1
	case T2:
		return 2
	case T3:
		return 3
	case T4:
		return 4
	}
	return 0
}

// Compare returns -1, 0 or +1 as c is less, equally or more sensitive than
// o. Invalid classes sort below T1.
func (c DataClass) Compare(o DataClass) int { return cmpInt(c.rank(), o.rank()) }

// Less reports whether c is strictly less sensitive than o.
func (c DataClass) Less(o DataClass) bool { return c.rank() < o.rank() }

// Max returns the more sensitive of c and o.
func (c DataClass) Max(o DataClass) DataClass {
	if c.Less(o) {
		return o
	}
	return c
}

// MaxDataClass returns the most sensitive of the given classes, or "" when
// none is given.
func MaxDataClass(classes ...DataClass) DataClass {
	var m DataClass
	for _, c := range classes {
		m = m.Max(c)
	}
	return m
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func joinLevels[T ~string](ls []T) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}
