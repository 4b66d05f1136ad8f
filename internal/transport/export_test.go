package transport

// SocketWrites is how many writes reached the socket of c's current
// connection.
func SocketWrites(c *Conn) int {
	w := c.wire.Load()
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}
