package runner

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// TestAddressInUseFailsTheStart: a sidecar that cannot bind its local API
// (or its probes) must fail to start, naming the variable, before it
// consumes a command: otherwise it accepts tasks its harness cannot reach
// (seen in CI: the harness got the probe server's 404 and the session
// failed with harness_lost).
func TestAddressInUseFailsTheStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		return l.Addr().String()
	}
	for _, tc := range []struct {
		name, env  string
		api, probe string
	}{
		{"api", config.EnvAPIAddr, taken.Addr().String(), free()},
		{"probes", config.EnvProbeAddr, free(), taken.Addr().String()},
		{"both on one address", config.EnvAPIAddr, "127.0.0.1:0", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.api == "127.0.0.1:0" {
				tc.api = free()
				tc.probe = tc.api
			}
			cfg := &config.Config{Mode: config.ModeCallee, ID: "lab", Namespace: "ns", PodName: "pod",
				APIAddr: tc.api, ProbeAddr: tc.probe}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err := Run(ctx, cfg, logr.Discard())
			if err == nil || !strings.Contains(err.Error(), tc.env) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("Run = %v; want an error naming %s and the address in use", err, tc.env)
			}
		})
	}
}
