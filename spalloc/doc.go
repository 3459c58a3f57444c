// Package spalloc speaks the spalloc JSON-line protocol (docs/reference/spalloc.md)
// so that the spalloc client library and its command-line tools work
// against arbiter unchanged: a spalloc "job" is an arbiter Allocation on a
// grid machine.
//
// This package is the protocol without the network: framing, decoding of
// the seventeen commands with their positional and keyword arguments,
// validation with the messages clients know, per-connection notification
// watches, and the encoding of replies, exceptions and notifications. A
// server is a loop per connection:
//
//	lines := spalloc.NewLineReader(conn, spalloc.MaxLineBytes)
//	s := spalloc.NewSession(peerHost)
//	for {
//		line, err := lines.ReadLine()     // ErrLineTooLong: close
//		if err != nil { return }
//		reply, err := s.Handle(backend, line)
//		if err != nil { return }         // undispatchable: close, no reply
//		conn.Write(reply)                 // nil for a blank line
//		// then, after the reply, whatever s.Notify(changes) returns
//	}
//
// Backend is what the server needs of the rest of arbiter: creating and
// destroying jobs, their state (refreshing keepalives), power, the grid
// machines and which job holds a board.
//
// Framing: one JSON object per line ended by "\n" (a trailing "\r" is
// accepted), at most MaxLineBytes bytes; a longer line closes the
// connection. Blank lines are ignored.
package spalloc
