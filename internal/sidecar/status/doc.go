// Package status writes HCPSession status for the hcp-sidecar, in both
// modes: the callee sidecar records the session's state, progress and
// sequence numbers; the caller sidecar records callerAckedSequence.
//
// Writes are coalesced per session: whatever the event rate, a session's
// status is written at most once per interval (latest state wins; a
// session's first write too waits an interval from its first change), a
// state change is written at once (UpdateAfter holds one back briefly, to
// share a write with the next), and nothing is written when nothing
// changed.
// All writes of a Writer share a budget (SetBudget): state changes go
// first, progress is coalesced further when the budget is short, and
// progress writes go one at a time, at most the budget's rate (no burst of
// them when many sessions' intervals end together). Each write
// is a JSON merge patch of the status subresource holding only the fields
// that differ from what this writer last wrote, under the field manager
// "hcp-sidecar". Merge patches rather than server-side apply: both sidecars
// share the field manager name, and an apply from the caller sidecar (which
// owns only callerAckedSequence) would remove every field the callee
// sidecar applied under the same manager. A diff-based merge patch touches
// exactly the fields its writer changed, so the two sidecars never clobber
// each other, and it needs no read before writing.
//
// With SetStateLabel (the callee sidecar), the writer also keeps a label
// (hcp.io/state) equal to status.state, so that sessions can be selected by
// state: a label is metadata, which a status write cannot change, so each
// write that changes the state is followed by one metadata merge patch of
// that label. State changes coalesced within an interval cost one label
// write at most; writes that do not change the state cost none.
//
// With SetDeriveConditions (the callee sidecar), every Update also derives
// the kstatus conditions Ready, Reconciling and Stalled from the state
// (SetConditions), so they travel in the same write as the state.
//
// With SetOwnerEpochGuard (the callee sidecar), a status carrying an
// ownerEpoch is written only while the stored one is still that epoch:
// JSON patches testing /status/ownerEpoch, field by field; a write that
// finds a later owner's epoch drops the session (ErrFenced, SetOnFenced).
//
// # Where things are
//
// One type, Writer, owns every session's status: what was written (its
// entries), what is wanted, and when the next write goes. Its methods are
// split by job; the write budget, which needs none of the Writer's state or
// lock, is a type of its own (writeBudget).
//
//	doc.go         this map
//	writer.go      Options, the Writer and its entries, New, settings, Run
//	update.go      what sidecars call: Seed, Update, UpdateAfter, Flush, Forget, Status; the waiters of a Flush
//	write.go       the write loop: when an entry is due, one attempt (status patch, state label), its outcome, retries
//	budget.go      SetBudget and writeBudget: the token bucket all writes share
//	guard.go       owner-epoch guarded writes (SetOwnerEpochGuard)
//	conditions.go  SetConditions: the kstatus conditions derived from the state
package status
