package kubectlhcp

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	rabbithole "github.com/michaelklishin/rabbit-hole/v3"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// The check's verdict for each thing the broker can do with the probe.
func TestMessageSizeCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		probe  sizeProbe
		err    error
		status CheckStatus
		detail []string
	}{
		{name: "refused, naming the setting", probe: sizeProbe{Refused: true, Limit: 8388608, Reason: "PRECONDITION_FAILED - message size 8388609 is larger than configured max size 8388608"},
			status: CheckOK, detail: []string{"8388608 bytes (8 MiB)"}},
		{name: "refused below the documented limit", probe: sizeProbe{Refused: true, Limit: 2 << 20}, status: CheckOK, detail: []string{"2097152 bytes (2 MiB)"}},
		{name: "refused without naming it", probe: sizeProbe{Refused: true, Reason: "PRECONDITION_FAILED - too big"}, status: CheckOK, detail: []string{"at most 8388608 bytes", "too big"}},
		{name: "accepted", probe: sizeProbe{}, status: CheckFail, detail: []string{"above 8388608 bytes", "accepted a message of 8388609 bytes", "docs/install.md"}},
		{name: "not probed", err: errors.New("AMQP 10.0.0.1:5672: dial tcp: i/o timeout"), status: CheckWarn, detail: []string{"unknown", "i/o timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := messageSizeCheck("connection Secret ns/b", tc.probe, tc.err)
			if c.Status != tc.status {
				t.Errorf("status %v, want %v: %+v", c.Status, tc.status, c)
			}
			if c.Name != "broker max_message_size (connection Secret ns/b)" {
				t.Errorf("name %q", c.Name)
			}
			for _, s := range tc.detail {
				if !strings.Contains(c.Detail, s) {
					t.Errorf("detail %q lacks %q", c.Detail, s)
				}
			}
			if c.Status != CheckOK && !strings.Contains(c.Fix, "8388608") {
				t.Errorf("fix %q does not say the value to set", c.Fix)
			}
		})
	}
	var d doctor
	if c := d.messageSize(t.Context(), brokerAccess{Ref: "RabbitmqCluster ns/r"}, "", ""); c.Status != CheckWarn || !strings.Contains(c.Detail, "no AMQP address") {
		t.Errorf("a broker with no AMQP address: %+v", c)
	}
}

// The probe against the test bed's RabbitMQ: a message under the limit is
// confirmed, one just above the documented limit is refused naming the
// setting, and what the probe finds is what rabbitmqctl reads, when this
// process may run it.
func TestProbeMaxMessageSize(t *testing.T) {
	b := testbed.EnsureRabbitMQ(t)
	vhost := "doctor-probe-" + uuid.NewString()[:8]
	if err := b.CreateVhost(vhost); err != nil {
		t.Fatal(err)
	}
	b.CleanupVhost(t, vhost)
	if _, err := b.API.UpdatePermissionsIn(vhost, b.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	limit, known := b.MaxMessageSize()
	t.Logf("rabbitmqctl: max_message_size %d (known: %v)", limit, known)

	small, err := probeMaxMessageSize(t.Context(), b.AMQPURL, b.Username, b.Password, vhost, 64<<10)
	if err != nil || small.Refused {
		t.Fatalf("a 64 KiB probe: %+v, %v; want it confirmed", small, err)
	}

	size := DocumentedMaxMessageSize + 1
	p, err := probeMaxMessageSize(t.Context(), b.AMQPURL, b.Username, b.Password, vhost, size)
	if err != nil {
		t.Fatalf("probe of %d bytes: %v", size, err)
	}
	t.Logf("probe of %d bytes: %+v", size, p)
	switch {
	case known && int64(size) > limit && (!p.Refused || p.Limit != limit):
		t.Fatalf("the broker's max_message_size is %d, but the probe found %+v", limit, p)
	case known && int64(size) <= limit && p.Refused:
		t.Fatalf("the broker's max_message_size is %d, but a probe of %d bytes was refused: %+v", limit, size, p)
	case p.Refused && (p.Limit <= 0 || p.Limit >= int64(size)):
		t.Fatalf("refused, but the limit read from %q is %d", p.Reason, p.Limit)
	}
	c := messageSizeCheck("local", p, nil)
	if p.Refused && (c.Status != CheckOK || !strings.Contains(c.Detail, strconv.FormatInt(p.Limit, 10))) {
		t.Errorf("the check of a broker that refused the probe: %+v", c)
	}
	if !p.Refused && c.Status != CheckFail {
		t.Errorf("the check of a broker that accepted the probe: %+v", c)
	}
	t.Logf("kubectl hcp doctor would say: %s: %s", c.Name, c.Detail)

	// Wrong credentials: unknown, a warning saying why.
	_, err = probeMaxMessageSize(t.Context(), b.AMQPURL, b.Username, "wrong", vhost, size)
	if err == nil {
		t.Fatal("a probe with a wrong password ran")
	}
	if c := messageSizeCheck("local", sizeProbe{}, err); c.Status != CheckWarn {
		t.Errorf("a probe that could not run: %+v", c)
	}
}
