package resource

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// withUserEnv adds the user's spec.sidecar.env to the operator's env: a
// variable of a name the operator sets (OTEL_* for tracing) replaces it in
// place, any other is appended in the user's order. The API refuses HCP_*
// names, the operator's contract with the sidecar; none is taken here
// either, should one come from an object older than that rule.
func withUserEnv(env, user []corev1.EnvVar) []corev1.EnvVar {
	at := make(map[string]int, len(env))
	for i, e := range env {
		at[e.Name] = i
	}
	for _, u := range user {
		if isContractEnv(u.Name) {
			continue
		}
		if i, ok := at[u.Name]; ok {
			env[i] = *u.DeepCopy()
			continue
		}
		at[u.Name] = len(env)
		env = append(env, *u.DeepCopy())
	}
	return env
}

// isContractEnv reports whether name is one of the operator's HCP_*
// variables (internal/sidecar/config).
func isContractEnv(name string) bool { return strings.HasPrefix(name, "HCP_") }
