package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

func TestSplit(t *testing.T) {
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get"}},
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}
	ns, cl := split(rules)
	wantNS := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
	wantCl := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get"}},
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}
	if !reflect.DeepEqual(ns, wantNS) {
		t.Errorf("namespaced rules:\n got %+v\nwant %+v", ns, wantNS)
	}
	if !reflect.DeepEqual(cl, wantCl) {
		t.Errorf("cluster rules:\n got %+v\nwant %+v", cl, wantCl)
	}
}

func TestRenderRefusesWildcardsAndEscalation(t *testing.T) {
	for _, r := range []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"*"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"*"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles"}, Verbs: []string{"escalate"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles"}, Verbs: []string{"bind"}},
	} {
		if _, err := render([]rbacv1.PolicyRule{r}); err == nil {
			t.Errorf("render(%+v) succeeded, want an error", r)
		}
	}
}

func TestRenderIsDeterministicAndOmitsEmptyClusterRole(t *testing.T) {
	rules := []rbacv1.PolicyRule{{APIGroups: []string{"hcp.io"}, Resources: []string{"callees"}, Verbs: []string{"get", "list", "watch"}}}
	a, err := render(rules)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := render(rules)
	if !bytes.Equal(a, b) {
		t.Fatal("two renders of the same rules differ")
	}
	if strings.Contains(string(a), "manager-cluster") {
		t.Error("a ClusterRole for cluster-scoped rules was rendered although there are none")
	}
	if !strings.Contains(string(a), "DO NOT EDIT") {
		t.Error("the generated header is missing")
	}
}
