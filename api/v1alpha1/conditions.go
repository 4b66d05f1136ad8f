package v1alpha1

// Condition types reported in status.conditions.
const (
	// ConditionReady summarises the object: true when everything it needs works.
	ConditionReady = "Ready"
	// ConditionTopologyReady is true when every topology-operator object
	// (vhost, exchanges, queue, binding, user, permission) reports Ready.
	ConditionTopologyReady = "TopologyReady"
	// ConditionHarnessReady is true when the harness Deployment is available.
	ConditionHarnessReady = "HarnessReady"
	// ConditionRulesMatched is true when every rule of a CapabilityPolicy
	// matches at least one Callee and one Caller.
	ConditionRulesMatched = "RulesMatched"
	// ConditionAbortRequested is set on an HCPSession once an abort reached it.
	ConditionAbortRequested = "AbortRequested"
	// ConditionHandover is set on an HCPSession that moved between
	// replicas of its Callee (released at a drain, taken over after its
	// replica was lost, or resumed after its harness restarted).
	ConditionHandover = "Handover"
	// ConditionReconciling (kstatus, abnormal-true): the object is on its
	// way to what its spec asks and nothing needs fixing yet; present only
	// while True. See docs/gitops.md.
	ConditionReconciling = "Reconciling"
	// ConditionStalled (kstatus, abnormal-true): the object cannot get to
	// what its spec asks without someone fixing something (or, for an
	// HCPSession, it ended without completing); present only while True.
	ConditionStalled = "Stalled"
)

// Condition reasons.
const (
	ReasonReconciled            = "Reconciled"
	ReasonReconcileFailed       = "ReconcileFailed"
	ReasonIDConflict            = "IDConflict"
	ReasonInvalidID             = "InvalidID"
	ReasonBrokerNotConfigured   = "BrokerNotConfigured"
	ReasonBrokerSecretNotFound  = "BrokerSecretNotFound"
	ReasonBrokerSecretUnlabeled = "BrokerSecretUnlabeled"
	ReasonBrokerSecretInvalid   = "BrokerSecretInvalid"
	// ReasonTLSSecretNotFound, ReasonTLSSecretUnlabeled and
	// ReasonTLSSecretInvalid: a Secret named in spec.broker.tls is missing,
	// invisible to the manager, or does not hold a usable CA bundle or
	// client certificate. The harness is not deployed (or not changed)
	// until it is fixed; the topology is.
	ReasonTLSSecretNotFound     = "TLSSecretNotFound"
	ReasonTLSSecretUnlabeled    = "TLSSecretUnlabeled"
	ReasonTLSSecretInvalid      = "TLSSecretInvalid"
	ReasonTopologyPending       = "TopologyPending"
	ReasonTopologyFailed        = "TopologyFailed"
	ReasonDeploymentAvailable   = "DeploymentAvailable"
	ReasonDeploymentUnavailable = "DeploymentUnavailable"
	ReasonDeploymentProgressing = "DeploymentProgressing"
	// ReasonProgressDeadlineExceeded: the harness Deployment is unavailable
	// and its rollout passed progressDeadlineSeconds (the Deployment's
	// Progressing condition is False): crash-looping pods, an image that
	// cannot be pulled, a quota.
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonNoHarness                = "NoHarness"
	ReasonScaledToZero             = "ScaledToZero"
	ReasonAllRulesMatched          = "AllRulesMatched"
	ReasonRuleMatchesNothing       = "RuleMatchesNothing"
	ReasonNoCalleesSelected        = "NoCalleesSelected"
	ReasonInvalidSelector          = "InvalidSelector"
	ReasonInvalidRules             = "InvalidRules"
	// ReasonDeleting: a Callee or Caller waits for its topology objects to
	// be removed from the broker before it goes.
	ReasonDeleting = "Deleting"
)

// Reasons of an HCPSession's Ready, Reconciling and Stalled conditions:
// its L2 state in CamelCase (status.reason keeps the protocol's reason).
const (
	ReasonSessionPending   = "Pending"
	ReasonSessionRunning   = "Running"
	ReasonSessionPaused    = "Paused"
	ReasonSessionAborting  = "Aborting"
	ReasonSessionCompleted = "Completed"
	ReasonSessionFailed    = "Failed"
	ReasonSessionAborted   = "Aborted"
	ReasonSessionRejected  = "Rejected"
)

// Labels and annotations the operator sets or reads.
const (
	// LabelCallee marks objects belonging to a Callee (value: Callee name).
	LabelCallee = "hcp.io/callee"
	// LabelCaller marks objects belonging to a Caller (value: Caller name).
	LabelCaller = "hcp.io/caller"
	// LabelCallerNamespace marks the objects of a Caller that live outside
	// its namespace (value: the Caller's namespace; with LabelCaller, they
	// name the Caller): the Roles and RoleBindings that let its sidecar
	// read HCPSessions where its Callees are (status.sessionNamespaces).
	LabelCallerNamespace = "hcp.io/caller-namespace"
	// LabelCalleeID is set on HCPSessions to the session's callee id.
	LabelCalleeID = "hcp.io/callee-id"
	// LabelCallerID is set on HCPSessions to the session's caller id.
	LabelCallerID = "hcp.io/caller-id"
	// LabelSessionState mirrors status.state on HCPSessions for selection
	// (kubectl get hcps -l hcp.io/state=RUNNING). The callee sidecar sets it
	// at creation, right after each status write that changes the state,
	// and, for the final state, with the session's terminal record.
	// It is for selection only: nothing trusts it.
	LabelSessionState = "hcp.io/state"
	// LabelVhostKey groups shared per-vhost objects (the two exchanges).
	LabelVhostKey = "hcp.io/vhost-key"
	// LabelManagedBy is app.kubernetes.io/managed-by.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of LabelManagedBy on objects we create.
	ManagedByValue = "hcp-operator"
	// AnnotationConfigHash on the pod template rolls pods on config changes.
	AnnotationConfigHash = "hcp.io/config-hash"
	// AnnotationRotateTokenKey on a Callee asks for a new session-token
	// signing key: each new value rotates once (use a timestamp). The
	// retired key keeps verifying tokens of running sessions.
	AnnotationRotateTokenKey = "hcp.io/rotate-token-key"
	// AnnotationTokenKeyRotation on the Secret with a Callee's token keys
	// (its credentials Secret) is the value of AnnotationRotateTokenKey last
	// carried out.
	AnnotationTokenKeyRotation = "hcp.io/token-key-rotation"
	// AnnotationTokenKeysMovedTo on the token Secret of an earlier version
	// (hcp-callee-N-token) names the Secret its keys moved to; the operator
	// empties it once no pod mounts it, and garbage collection deletes it
	// with the Callee.
	AnnotationTokenKeysMovedTo = "hcp.io/token-keys-moved-to"
)
