package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

func kubeletWrite(t *testing.T, dir, key, content string) {
	testbed.WriteSecretVolume(t, dir, map[string][]byte{key: []byte(content)})
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func parseURL(b []byte) (string, error) {
	s := strings.TrimSpace(string(b))
	if !strings.HasPrefix(s, "amqp://") {
		return "", errors.New("not an amqp URL")
	}
	return s, nil
}

func TestFollowsTheKubeletsAtomicUpdates(t *testing.T) {
	dir := t.TempDir()
	kubeletWrite(t, dir, "uri", "amqp://u:old@h/v")
	clk := &fakeClock{t: time.Unix(0, 0)}
	var changes []string
	var errs []error
	f, err := Load(filepath.Join(dir, "uri"), parseURL, Options[string]{
		Now: clk.now, OnChange: func(v string) { changes = append(changes, v) }, OnError: func(e error) { errs = append(errs, e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Get(); got != "amqp://u:old@h/v" {
		t.Fatalf("first value %q", got)
	}
	kubeletWrite(t, dir, "uri", "amqp://u:new@h/v")
	if got := f.Get(); got != "amqp://u:old@h/v" {
		t.Fatalf("reread before the interval: %q", got)
	}
	clk.add(DefaultInterval)
	if got := f.Get(); got != "amqp://u:new@h/v" {
		t.Fatalf("after rotation %q", got)
	}
	// A bad update keeps the last good value and is reported once.
	kubeletWrite(t, dir, "uri", "garbage")
	for range 3 {
		clk.add(DefaultInterval)
		if got := f.Get(); got != "amqp://u:new@h/v" {
			t.Fatalf("after a bad update %q", got)
		}
	}
	// The file gone (Secret deleted): still the last good value.
	if err := os.Remove(filepath.Join(dir, "uri")); err != nil {
		t.Fatal(err)
	}
	clk.add(DefaultInterval)
	if got := f.Get(); got != "amqp://u:new@h/v" {
		t.Fatalf("after removal %q", got)
	}
	if len(changes) != 1 || changes[0] != "amqp://u:new@h/v" {
		t.Errorf("changes = %q", changes)
	}
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "not an amqp URL") || !errors.Is(errs[1], os.ErrNotExist) {
		t.Errorf("errors = %v, want the parse error once, then the missing file", errs)
	}
}

func TestFirstLoadMustSucceed(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing"), parseURL, Options[string]{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	p := filepath.Join(dir, "bad")
	_ = os.WriteFile(p, []byte("x"), 0o600)
	if _, err := Load(p, parseURL, Options[string]{}); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("bad content: %v, want an error naming the file", err)
	}
}

func TestStatic(t *testing.T) {
	f := Static("v")
	if f.Get() != "v" || f.Path() != "" {
		t.Fatal("static value")
	}
}

func TestConcurrentGet(t *testing.T) {
	dir := t.TempDir()
	kubeletWrite(t, dir, "uri", "amqp://a")
	f, err := Load(filepath.Join(dir, "uri"), parseURL, Options[string]{Interval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if v := f.Get(); v != "amqp://a" && v != "amqp://b" {
					t.Errorf("goroutine %d saw %q", i, v)
					return
				}
			}
		}()
	}
	kubeletWrite(t, dir, "uri", "amqp://b")
	wg.Wait()
}
