package runner

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// A rotated broker password (the kubelet replacing the mounted Secret's
// file) is picked up at the next dial and reported once, for the Event on
// the sidecar's Callee or Caller.
func TestRotatedCredentialsAreReported(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "amqp-url")
	write := func(v string) {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("amqp://callee.lab:old@broker:5672/v")
	rotations := 0
	url, err := amqpURLSource(&config.Config{AMQPURLFile: file}, logr.Discard(), func() { rotations++ })
	if err != nil {
		t.Fatal(err)
	}
	if got := url(); got != "amqp://callee.lab:old@broker:5672/v" || rotations != 0 {
		t.Fatalf("first read %q, %d rotations", got, rotations)
	}
	write("amqp://callee.lab:new@broker:5672/v")
	deadline := time.Now().Add(10 * time.Second)
	for url() != "amqp://callee.lab:new@broker:5672/v" {
		if time.Now().After(deadline) {
			t.Fatal("the rotated URL was not read")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = url()
	if rotations != 1 {
		t.Fatalf("%d rotations reported, want 1", rotations)
	}
}

func TestHarnessRef(t *testing.T) {
	for mode, kind := range map[config.Mode]string{config.ModeCallee: "Callee", config.ModeCaller: "Caller"} {
		ref := harnessRef(&config.Config{Mode: mode, Namespace: "lab", ObjectName: "cvd"})
		if ref.Kind != kind || ref.Namespace != "lab" || ref.Name != "cvd" || ref.APIVersion != "hcp.io/v1alpha1" {
			t.Errorf("%s: %+v", mode, ref)
		}
	}
}
