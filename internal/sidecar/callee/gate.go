package callee

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// identify returns the caller id of the broker-validated user_id of a
// command: the role must be caller and the vhost this sidecar's. A message
// without a valid user_id cannot be answered (there is no trustworthy reply
// address) and is discarded.
func identify(userID, vhost string) (string, error) {
	if userID == "" {
		return "", fmt.Errorf("the message has no user_id property: its sender is unauthenticated")
	}
	role, vh, id, err := topology.ParseUsername(userID)
	if err != nil {
		return "", fmt.Errorf("user_id %q is not an HCP broker user: %w", truncate(userID, 80), err)
	}
	if role != topology.RoleCaller {
		return "", fmt.Errorf("user_id %q is a %s, not a caller", truncate(userID, 80), role)
	}
	if vh != vhost {
		return "", fmt.Errorf("user_id %q belongs to vhost %q, not %q", truncate(userID, 80), vh, vhost)
	}
	return id, nil
}

// decodeSubmit decodes and validates a task_submit payload.
func decodeSubmit(payload []byte) (*task.TaskSubmit, error) {
	var ts task.TaskSubmit
	if err := json.Unmarshal(payload, &ts); err != nil {
		return nil, fmt.Errorf("invalid task_submit payload: %w", err)
	}
	if err := ts.Validate(); err != nil {
		return nil, err
	}
	if _, err := policy.RequestedRisk(&ts); err != nil {
		return nil, err
	}
	return &ts, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Do not cut a UTF-8 sequence in half.
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// oneLine makes an error message fit a log line and a status field.
func oneLine(s string, n int) string {
	return truncate(strings.Join(strings.Fields(s), " "), n)
}
