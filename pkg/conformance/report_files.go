package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
)

// WriteJSON writes the report as one indented JSON document.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// The JUnit XML schema as CI systems read it (Jenkins, GitLab, GitHub
// test reporters): one testsuite, one testcase per check.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr,omitempty"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as JUnit XML: a testcase per check named
// "ID statement", its classname hcp-conformance.KIT.PROFILE; a failure's
// message is the citation and what was seen.
func (r Report) WriteJUnit(w io.Writer) error {
	kit := r.Kit
	if kit == "" {
		kit = "callee"
	}
	s := junitSuite{
		Name: "hcp-conformance " + kit, Tests: len(r.Rows), Failures: r.Count(Fail), Skipped: r.Count(Skip),
		Time:       fmt.Sprintf("%.3f", r.Duration.Seconds()),
		Properties: []junitProperty{{"kit", kit}, {"profile", r.Profile}, {"peer", r.Peer}, {"self", r.Self}},
	}
	if !r.Started.IsZero() {
		s.Timestamp = r.Started.UTC().Format("2006-01-02T15:04:05")
	}
	if r.Broker.MaxMessageSize > 0 {
		s.Properties = append(s.Properties, junitProperty{"broker.max_message_size", fmt.Sprint(r.Broker.MaxMessageSize)})
	}
	for _, row := range r.Rows {
		c := junitCase{Name: row.ID + " " + row.Statement, Classname: "hcp-conformance." + kit + "." + row.Profile}
		cited := row.Cite.String()
		switch row.Result {
		case Fail:
			c.Failure = &junitMessage{Message: levelOr(row.Level) + " " + cited, Type: "nonconformance", Text: row.Detail}
		case Skip:
			c.Skipped = &junitMessage{Message: row.Detail}
		default:
			c.SystemOut = cited + "\n" + row.Detail
		}
		s.Cases = append(s.Cases, c)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// WriteFiles writes the JSON report to jsonPath and the JUnit XML to
// junitPath; an empty path is skipped.
func (r Report) WriteFiles(jsonPath, junitPath string) error {
	var errs []string
	for _, f := range []struct {
		path  string
		write func(io.Writer) error
	}{{jsonPath, r.WriteJSON}, {junitPath, r.WriteJUnit}} {
		if f.path == "" {
			continue
		}
		if err := writeFile(f.path, f.write); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
