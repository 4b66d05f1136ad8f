package config

import (
	"strings"
	"testing"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func common(mode string, extra ...string) func(string) (string, bool) {
	return env(append([]string{EnvMode, mode, EnvID, "lab", EnvNamespace, "ns", EnvUsername, "u", EnvHarnessURL, "http://127.0.0.1:1"}, extra...)...)
}

// Secrets come as a value or as a file, exactly one of them; an error never
// quotes the URL (it holds the password).
func TestSecretsAsValueOrFile(t *testing.T) {
	for _, c := range []struct {
		name    string
		lookup  func(string) (string, bool)
		wantErr string
	}{
		{"caller with a URL file", common("caller", EnvAMQPURLFile, "/etc/hcp/credentials/uri"), ""},
		{"caller with a URL", common("caller", EnvAMQPURL, "amqp://u:p@h/v"), ""},
		{"caller with neither", common("caller"), EnvAMQPURLFile + " (or " + EnvAMQPURL + ") is required"},
		{"caller with both", common("caller", EnvAMQPURL, "amqp://u:p@h/v", EnvAMQPURLFile, "/f"), "not both"},
		{"bad URL", common("caller", EnvAMQPURL, "http://u:hunter2@h/v"), "must be an amqp:// or amqps:// URL"},
		{"callee with key files", common("callee", EnvAMQPURLFile, "/f", EnvTokenKeyFile, "/k", EnvTokenVerifyKeysFile, "/v"), ""},
		{"callee without a key", common("callee", EnvAMQPURLFile, "/f"), EnvTokenKeyFile + " (or " + EnvTokenKey + ") is required"},
		{"callee with both keys", common("callee", EnvAMQPURLFile, "/f", EnvTokenKey, "pem", EnvTokenKeyFile, "/k"), "not both"},
	} {
		cfg, err := FromEnv(c.lookup)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: %v, want %q", c.name, err, c.wantErr)
		case err != nil && strings.Contains(err.Error(), "hunter2"):
			t.Errorf("%s: the error quotes the password: %v", c.name, err)
		case c.name == "callee with key files" && (cfg.TokenKeyFile != "/k" || cfg.TokenVerifyKeysFile != "/v" || cfg.AMQPURLFile != "/f"):
			t.Errorf("%s: %+v", c.name, cfg)
		}
	}
}

func TestCheckAMQPURL(t *testing.T) {
	for u, ok := range map[string]bool{
		"amqp://u:p@h:5672/%2Fhcp": true, "amqps://h": true, " amqp://h/v\n": true,
		"http://h": false, "amqp://": false, "": false, "::": false,
	} {
		if err := CheckAMQPURL(u); (err == nil) != ok {
			t.Errorf("CheckAMQPURL(%q) = %v", u, err)
		}
	}
}

// HCP_APP_MAX_BATCH: 1 by default, 1..MaxAppBatch, anything else refused
// with its name.
func TestAppMaxBatch(t *testing.T) {
	for _, c := range []struct {
		value   string
		want    int
		wantErr bool
	}{{"", 1, false}, {"1", 1, false}, {"100", 100, false}, {"1000", 1000, false}, {"0", 0, true}, {"1001", 0, true}, {"x", 0, true}} {
		extra := []string{EnvAMQPURLFile, "/f"}
		if c.value != "" {
			extra = append(extra, EnvAppMaxBatch, c.value)
		}
		cfg, err := FromEnv(common("caller", extra...))
		switch {
		case c.wantErr && (err == nil || !strings.Contains(err.Error(), EnvAppMaxBatch)):
			t.Errorf("%q: %v, want an error naming %s", c.value, err, EnvAppMaxBatch)
		case !c.wantErr && (err != nil || cfg.AppMaxBatch != c.want):
			t.Errorf("%q: %d, %v; want %d", c.value, cfg.AppMaxBatch, err, c.want)
		}
	}
}

// HCP_APP_STREAM: false by default, a boolean, anything else refused with
// its name.
func TestAppStream(t *testing.T) {
	for _, c := range []struct {
		value   string
		want    bool
		wantErr bool
	}{{"", false, false}, {"true", true, false}, {"1", true, false}, {"false", false, false}, {"yes", false, true}} {
		extra := []string{EnvAMQPURLFile, "/f"}
		if c.value != "" {
			extra = append(extra, EnvAppStream, c.value)
		}
		cfg, err := FromEnv(common("caller", extra...))
		switch {
		case c.wantErr && (err == nil || !strings.Contains(err.Error(), EnvAppStream)):
			t.Errorf("%q: %v, want an error naming %s", c.value, err, EnvAppStream)
		case !c.wantErr && (err != nil || cfg.AppStream != c.want):
			t.Errorf("%q: %v, %v; want %v", c.value, cfg.AppStream, err, c.want)
		}
	}
}

// HCP_APP_MAX_ATTEMPTS: unset is 0 (the caller sidecar's default),
// 1..1000, anything else refused with its name.
func TestAppMaxAttempts(t *testing.T) {
	for _, c := range []struct {
		value   string
		want    int
		wantErr bool
	}{{"", 0, false}, {"1", 1, false}, {"25", 25, false}, {"1000", 1000, false}, {"0", 0, true}, {"1001", 0, true}, {"x", 0, true}} {
		extra := []string{EnvAMQPURLFile, "/f"}
		if c.value != "" {
			extra = append(extra, EnvAppMaxAttempts, c.value)
		}
		cfg, err := FromEnv(common("caller", extra...))
		switch {
		case c.wantErr && (err == nil || !strings.Contains(err.Error(), EnvAppMaxAttempts)):
			t.Errorf("%q: %v, want an error naming %s", c.value, err, EnvAppMaxAttempts)
		case !c.wantErr && (err != nil || cfg.AppMaxAttempts != c.want):
			t.Errorf("%q: %d, %v; want %d", c.value, cfg.AppMaxAttempts, err, c.want)
		}
	}
}

func TestAMQPAddresses(t *testing.T) {
	for _, c := range []struct {
		value string
		want  []string
	}{
		{"", nil},
		{"r1:5701", []string{"r1:5701"}},
		{" 10.0.0.1:5701, r2:5702 ,[::1]:5703", []string{"10.0.0.1:5701", "r2:5702", "[::1]:5703"}},
		{"r1", nil}, {"r1:5701,", nil}, {":5701", nil}, {"r1:0", nil}, {"r1:70000", nil}, {"r1:amqp", nil},
	} {
		cfg, err := FromEnv(common("caller", EnvAMQPURLFile, "/f", EnvAMQPAddresses, c.value))
		switch {
		case c.want == nil && c.value != "" && (err == nil || !strings.Contains(err.Error(), EnvAMQPAddresses)):
			t.Errorf("%q: %v, want an error naming %s", c.value, err, EnvAMQPAddresses)
		case (c.want != nil || c.value == "") && (err != nil || strings.Join(cfg.AMQPAddresses, " ") != strings.Join(c.want, " ")):
			t.Errorf("%q: %q, %v; want %q", c.value, cfg.AMQPAddresses, err, c.want)
		}
	}
}
