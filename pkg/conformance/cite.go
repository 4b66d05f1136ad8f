package conformance

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The profiles a check belongs to.
const (
	// ProfileSpec holds the checks of what the HCP specification itself
	// says (L1-transport-encoding.md, L2-session-lifecycle.md,
	// 00-architecture.md): always run.
	ProfileSpec = "spec"
	// ProfileHCPOperator adds this project's own stricter choices (the
	// decoder's answers where the spec is silent, docs/conformance.md
	// table 4; the identity, payload and reason-code design of DESIGN.md
	// §3–4; gap-free sequences; the broker's message size limit). Off by
	// default: a foreign peer is not failed for them.
	ProfileHCPOperator = "hcp-operator"
)

// Profiles lists the profiles a run can select.
func Profiles() []string { return []string{ProfileSpec, ProfileHCPOperator} }

// specFiles maps a Ref's prefix to the file it cites.
var specFiles = map[string]string{
	"L1": "L1-transport-encoding.md",
	"L2": "L2-session-lifecycle.md",
	"A":  "00-architecture.md",
	"C":  "docs/conformance.md",
	"D":  "DESIGN.md",
	"H":  "docs/harness-api.md",
	"I":  "docs/install.md",
}

// heading is a section title of a spec file and the line it starts on.
type heading struct {
	line  int
	title string
}

// specSections are the section headings of the spec files, by line, as
// the files have them (the spec's headings are plain lines).
var specSections = map[string][]heading{
	"L1": {{3, "Purpose"}, {19, "Message Envelope"}, {32, "Envelope Fields"}, {42, "AMQP Message Properties Mapping"},
		{55, "Message Types"}, {74, "AMQP Topology"}, {98, "Exchanges"}, {104, "Queues"}, {110, "Routing Keys"},
		{128, "Topology Example"}, {142, "Delivery Guarantees: Command Channel"}, {150, "Delivery Guarantees: Event Channel"},
		{157, "Stream Continuity"}, {171, "The Mechanism: AMQP ACK-Based Stream Continuity"},
		{194, "Caller Consumer Configuration"}, {203, "ACK Strategy"}, {225, "Caller Crash and Recovery"},
		{262, "Handling Redelivered Messages"}, {274, "Prefetch Tuning"}, {285, "Network Partition (Temporary Disconnection)"},
		{303, "Callee Independence"}, {312, "Multi-Session Stream Interleaving"}, {331, "Broker Failure"},
		{339, "Summary: Why No Custom Replay Protocol"}, {353, "Encoding"}, {362, "Queue Management: TTL and Cleanup"},
		{373, "Queue Size Limits"}, {377, "Connection and Authentication"}, {391, "TLS"}, {395, "Topology Initialization"}},
	"L2": {{3, "Purpose"}, {7, "Session"}, {22, "Session State Machine"}, {47, "State Definitions"},
		{59, "Valid State Transitions"}, {72, "Event Stream"}, {76, "Event Envelope"}, {97, "Standard Event Types"},
		{110, "Event Ordering"}, {116, "Integration with L1 Stream Continuity"}, {151, "Checkpoint & Recovery"},
		{170, "Recovery"}, {178, "Session Timeout"}, {184, "Abort Protocol"}},
	"A": {{2, "Layered Architecture"}, {18, "Layer Responsibilities"}, {49, "End-to-End Flow"},
		{85, "Layer Interaction Rules"}, {94, "Multiple Callee Harnesses"}},
}

// Citation is where a check's statement comes from.
type Citation struct {
	// File is the spec file ("L1-transport-encoding.md") or, for a
	// profile check, the project document ("docs/conformance.md").
	File string `json:"file"`
	// Line is the line in File (0 when the citation is a section or row).
	Line int `json:"line,omitempty"`
	// Section is the section title, or the row of a project table.
	Section string `json:"section,omitempty"`
	// Quote is the cited text, verbatim (spec citations only).
	Quote string `json:"quote,omitempty"`
}

// String renders the citation for a table cell or a failure message.
func (c Citation) String() string {
	var b strings.Builder
	b.WriteString(c.File)
	if c.Line > 0 {
		b.WriteString(":" + strconv.Itoa(c.Line))
	}
	if c.Section != "" {
		b.WriteString(" (" + c.Section + ")")
	}
	if c.Quote != "" {
		fmt.Fprintf(&b, ": %q", c.Quote)
	}
	return b.String()
}

// cite builds the citation of a Ref: "L1:356" (line 356 of
// L1-transport-encoding.md), "A:34" (00-architecture.md), "C#77" (row 77
// of docs/conformance.md), "D§3" (section 3 of DESIGN.md), "H#Gaps" or
// "I#Broker settings" (a section of docs/harness-api.md or docs/install.md).
func cite(ref, quote string) Citation {
	for _, sep := range []string{":", "#", "§"} {
		prefix, rest, ok := strings.Cut(ref, sep)
		file, known := specFiles[prefix]
		if !ok || !known {
			continue
		}
		c := Citation{File: file, Quote: quote}
		switch sep {
		case ":":
			n, _ := strconv.Atoi(rest)
			c.Line, c.Section = n, sectionOf(prefix, n)
		case "#":
			if _, err := strconv.Atoi(rest); err == nil {
				c.Section = "row " + rest
			} else {
				c.Section = rest
			}
		default:
			c.Section = "§" + rest
		}
		return c
	}
	return Citation{File: ref, Quote: quote}
}

// sectionOf returns the title of the section holding a line.
func sectionOf(prefix string, line int) string {
	hs := specSections[prefix]
	i := sort.Search(len(hs), func(i int) bool { return hs[i].line > line })
	if i == 0 {
		return ""
	}
	return hs[i-1].title
}
