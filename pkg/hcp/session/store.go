package session

import "sync"

// Store persists a caller's last_processed_sequence per session, so that
// deduplication survives a restart (L2 "Recovery after restart").
// Implementations must be safe for concurrent use. A Tracker calls Save
// after every Commit while holding its lock, so Save should be fast (an
// implementation backed by a slow store can coalesce writes, at the cost of
// redelivering a few already-processed events after a crash; L1 asks
// applications to be idempotent for exactly that case).
type Store interface {
	// Load returns the last processed sequence of the session, or 0 when
	// none was saved.
	Load(sessionID string) (int64, error)
	// Save records seq as the session's last processed sequence.
	Save(sessionID string, seq int64) error
}

// MemoryStore is an in-memory Store. Save never lowers a stored value.
type MemoryStore struct {
	mu sync.Mutex
	m  map[string]int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{m: map[string]int64{}} }

// Load implements Store.
func (s *MemoryStore) Load(sessionID string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[sessionID], nil
}

// Save implements Store.
func (s *MemoryStore) Save(sessionID string, seq int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.m[sessionID] {
		s.m[sessionID] = seq
	}
	return nil
}

// Delete forgets a session (for example once it is terminal and drained).
func (s *MemoryStore) Delete(sessionID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sessionID)
}
