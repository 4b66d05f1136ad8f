package relay

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/callee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// What the acceptance benchmark measures beside the relay: the floor's
// writes, the API server's count of HCPSession writes, an HCPSession like
// the gate's, the raw round trip's queues.

// floorSessionWrites makes the fewest writes a session that ends soon
// after its create needs to show its end, as the callee sidecar's status
// writer makes them (JSON merge patches under its field manager): the
// terminal status (the status subresource; a create cannot carry it), then
// the state label. The relay's sidecars make three: the terminal record
// (its label with it), the terminal status and the caller's position.
func floorSessionWrites(ctx context.Context, c client.Client, hs *v1alpha1.HCPSession) error {
	owner := client.FieldOwner(status.FieldOwner)
	done := string(v1alpha1.SessionCompleted)
	terminal := `{"status":{"state":"` + done + `","completedAt":"` + time.Now().UTC().Format(time.RFC3339) + `","result":{"summary":"ok"}}}`
	if err := c.Status().Patch(ctx, hs, client.RawPatch(types.MergePatchType, []byte(terminal)), owner); err != nil {
		return err
	}
	label := `{"metadata":{"labels":{"` + v1alpha1.LabelSessionState + `":"` + done + `"}}}`
	return c.Patch(ctx, hs, client.RawPatch(types.MergePatchType, []byte(label)), owner)
}

// settleSessionWrites waits until the API server's count of HCPSession
// writes has not moved for a second (at most settleMax): the late writes
// of what ran before (a series' status writes wait for their sidecar's
// write budget) would otherwise land on the next series' API server and
// time. It says so when it gives up.
func settleSessionWrites(ctx context.Context, b testing.TB, api rest.Interface) {
	last, since, start := sessionWrites(ctx, b, api).Of(hcpSessions), time.Now(), time.Now()
	for time.Since(since) < time.Second {
		if time.Since(start) > settleMax {
			b.Logf("HCPSession writes still going after %s; the next series starts beside them", settleMax)
			return
		}
		time.Sleep(200 * time.Millisecond)
		if n := sessionWrites(ctx, b, api).Of(hcpSessions); n != last {
			last, since = n, time.Now()
		}
	}
}

// settleMax bounds settleSessionWrites: a series of 133 sessions leaves
// about 400 budgeted writes, 8 s at a sidecar's default 50 a second.
const settleMax = time.Minute

// hcpSessions is the HCPSessions' resource in benchutil.APIWrites' keys.
const hcpSessions = "hcp.io/hcpsessions"

// sessionWrites is the API server's count so far of the writes to
// HCPSessions (their creates, status and label patches) from every
// client, by verb and subresource.
func sessionWrites(ctx context.Context, b testing.TB, api rest.Interface) benchutil.APIWrites {
	w, err := benchutil.ReadAPIWrites(ctx, api)
	if err != nil {
		b.Fatal(err)
	}
	return w.Only(hcpSessions)
}

// bareSession is an HCPSession as the callee sidecar's gate creates one for
// an admitted task no concurrency limit applies to (callee.newHCPSession):
// the same labels, annotations, owner and spec.
func bareSession(ns string, owner *v1alpha1.Callee) *v1alpha1.HCPSession {
	sid := uuid.NewString()
	return &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{
			Name: sid, Namespace: ns,
			Labels: map[string]string{
				v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID, v1alpha1.LabelCallee: owner.Name,
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, v1alpha1.LabelSessionState: string(v1alpha1.SessionRunning),
			},
			Annotations: map[string]string{
				callee.AnnotationDecidingPod: "bench", callee.AnnotationSequenceCeiling: strconv.Itoa(callee.DefaultSequenceBlock),
				v1alpha1.AnnotationAdmitted: "true",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Callee", Name: owner.Name, UID: owner.UID, Controller: new(true)}},
		},
		Spec: v1alpha1.HCPSessionSpec{
			SessionID: sid, CalleeID: calleeID, CallerID: callerID, Capability: "analyze", TaskMessageID: uuid.NewString(),
			RiskLevel: v1alpha1.RiskLevel(task.R1), DataClassification: v1alpha1.DataClass(task.T1), Intent: "acceptance benchmark",
			MaxDuration: "PT1H", IssuedAt: &metav1.Time{Time: time.Now().Truncate(time.Second)},
		},
	}
}

func declareQuorumQueues(url string, names ...string) error {
	return withChannel(url, func(ch *amqp.Channel) error {
		for _, q := range names {
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				return err
			}
		}
		return nil
	})
}
