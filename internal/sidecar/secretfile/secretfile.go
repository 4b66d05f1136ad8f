// Package secretfile reads a value from a file of a mounted Secret and
// follows the kubelet when it replaces the file, so that a rotated
// password or key takes effect without a restart and no secret has to sit
// in the process environment (/proc/PID/environ).
//
// The kubelet updates a Secret volume atomically (a new timestamped
// directory, then the ..data symlink swapped), so a read sees either the
// old or the new content, never a mix. A File rereads at most once per
// interval, on use; a read or parse error keeps the last good value, and
// is reported once per distinct error.
package secretfile

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultInterval is how often a File looks at the disk at most.
const DefaultInterval = time.Second

// File is a value parsed from a file, reloaded when the file changes.
// Safe for concurrent use.
type File[T any] struct {
	path     string
	parse    func([]byte) (T, error)
	interval time.Duration
	now      func() time.Time
	onChange func(T)
	onError  func(error)

	mu      sync.Mutex
	raw     []byte
	val     T
	checked time.Time
	lastErr string
}

// Options tune a File; the zero value is DefaultInterval, no callbacks.
type Options[T any] struct {
	Interval time.Duration
	// OnChange is called (with the File's lock held: keep it short) after a
	// changed file parsed, with the new value.
	OnChange func(T)
	// OnError is called when a reread fails or the new content does not
	// parse; the previous value stays in use.
	OnError func(error)
	// Now is the clock (tests).
	Now func() time.Time
}

// Load reads and parses path. Unlike later reloads, the first read must
// succeed: a sidecar does not start without its credentials.
func Load[T any](path string, parse func([]byte) (T, error), o Options[T]) (*File[T], error) {
	f := &File[T]{path: path, parse: parse, interval: o.Interval, now: o.Now, onChange: o.OnChange, onError: o.OnError}
	if f.interval <= 0 {
		f.interval = DefaultInterval
	}
	if f.now == nil {
		f.now = time.Now
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if f.val, err = parse(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.raw, f.checked = raw, f.now()
	return f, nil
}

// Static is a File that never changes (a value given in the environment,
// or a test's).
func Static[T any](v T) *File[T] { return &File[T]{val: v} }

// Path is the file's path ("" for Static).
func (f *File[T]) Path() string { return f.path }

// Get returns the current value, rereading the file if the interval has
// passed since the last look.
func (f *File[T]) Get() T {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.path == "" {
		return f.val
	}
	if now := f.now(); now.Sub(f.checked) >= f.interval {
		f.checked = now
		f.reload()
	}
	return f.val
}

func (f *File[T]) reload() {
	raw, err := os.ReadFile(f.path)
	if err == nil && bytes.Equal(raw, f.raw) {
		f.lastErr = ""
		return
	}
	var v T
	if err == nil {
		if v, err = f.parse(raw); err != nil {
			err = fmt.Errorf("%s: %w", f.path, err)
		}
	}
	if err != nil {
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			if f.onError != nil {
				f.onError(err)
			}
		}
		return
	}
	f.raw, f.val, f.lastErr = raw, v, ""
	if f.onChange != nil {
		f.onChange(v)
	}
}
