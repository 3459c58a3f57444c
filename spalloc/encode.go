package spalloc

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// The encoders append JSON to a buffer, in the shapes the reference sends
// (docs/reference/spalloc.md §2). Floats are printed as Python prints them ("60.0"), so that
// keepalives and times stay floats for the clients.

// EncodeException is the line of a failed command: {"exception": msg}.
func EncodeException(msg string) []byte {
	b := append(make([]byte, 0, len(msg)+20), `{"exception": `...)
	b = appendString(b, msg)
	return append(b, "}\n"...)
}

// EncodeJobsChanged is the notification {"jobs_changed": [ids]}.
func EncodeJobsChanged(ids []int64) []byte {
	b := append(make([]byte, 0, 24+8*len(ids)), `{"jobs_changed": [`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return append(b, "]}\n"...)
}

// EncodeMachinesChanged is the notification {"machines_changed": [names]}.
func EncodeMachinesChanged(names []string) []byte {
	b := append(make([]byte, 0, 64), `{"machines_changed": [`...)
	for i, n := range names {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendString(b, n)
	}
	return append(b, "]}\n"...)
}

func appendNull(b []byte) []byte { return append(b, "null"...) }

func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }

func itoa(n int) string { return strconv.Itoa(n) }

func appendBool(b []byte, v bool) []byte { return strconv.AppendBool(b, v) }

// appendInts appends a list of integers.
func appendInts(b []byte, ns ...int) []byte {
	b = append(b, '[')
	for i, n := range ns {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return append(b, ']')
}

// appendFloat prints f as Python's repr does: "60.0", "1700000000.25",
// "1e-05", "1e+16".
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendNull(b)
	}
	a := math.Abs(f)
	if a != 0 && (a < 1e-4 || a >= 1e16) {
		return strconv.AppendFloat(b, f, 'e', -1, 64)
	}
	if f == math.Trunc(f) {
		return strconv.AppendFloat(b, f, 'f', 1, 64)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

func appendFloatPtr(b []byte, f *float64) []byte {
	if f == nil {
		return appendNull(b)
	}
	return appendFloat(b, *f)
}

// appendTime prints a time as Unix seconds (a float).
func appendTime(b []byte, t time.Time) []byte {
	return appendFloat(b, float64(t.UnixMicro())/1e6)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else if r == '\u2028' || r == '\u2029' {
			b = append(b, `\u202`...)
			b = append(b, hexDigits[r&0xf])
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func appendStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return appendNull(b)
	}
	return appendString(b, *s)
}

func appendBoard(b []byte, x, y, z int) []byte { return appendInts(b, x, y, z) }

func appendBoards(b []byte, p *grid.Placement) []byte {
	b = append(b, '[')
	for i, bd := range p.Boards {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendBoard(b, bd.X, bd.Y, bd.Z)
	}
	return append(b, ']')
}

// live reports whether a job state is one in which the job has a power
// state and, once allocated, boards.
func live(s State) bool { return s == StateQueued || s == StatePower || s == StateReady }

// appendPower is a job's power: null unless it is in StatePower or
// StateReady.
func appendPower(b []byte, j *Job) []byte {
	if j.State != StatePower && j.State != StateReady {
		return appendNull(b)
	}
	return appendBool(b, j.Power)
}

// appendJobState is get_job_state's answer.
func appendJobState(b []byte, j *Job) []byte {
	b = append(b, `{"state": `...)
	b = strconv.AppendInt(b, int64(j.State), 10)
	b = append(b, `, "power": `...)
	b = appendPower(b, j)
	b = append(b, `, "keepalive": `...)
	if live(j.State) {
		b = appendFloatPtr(b, j.Keepalive)
	} else {
		b = appendNull(b)
	}
	b = append(b, `, "reason": `...)
	if j.State == StateDestroyed {
		b = appendStringPtr(b, j.Reason)
	} else {
		b = appendNull(b)
	}
	b = append(b, `, "start_time": `...)
	if live(j.State) {
		b = appendTime(b, j.Start)
	} else {
		b = appendNull(b)
	}
	b = append(b, `, "keepalivehost": `...)
	if live(j.State) {
		b = appendString(b, j.KeepaliveHost)
	} else {
		b = appendNull(b)
	}
	return append(b, '}')
}

// appendMachineInfo is get_job_machine_info's answer: all null unless the
// job holds boards of machine m.
func appendMachineInfo(b []byte, j *Job, m *arbiter.GridMachine) []byte {
	p := j.Placement
	if p == nil || m == nil || len(p.Boards) == 0 || (j.State != StatePower && j.State != StateReady) {
		return append(b, `{"width": null, "height": null, "connections": null, "machine_name": null, "boards": null}`...)
	}
	b = append(b, `{"width": `...)
	b = strconv.AppendInt(b, int64(p.WidthChips), 10)
	b = append(b, `, "height": `...)
	b = strconv.AppendInt(b, int64(p.HeightChips), 10)
	b = append(b, `, "connections": [`...)
	for i, bd := range p.Boards {
		if i > 0 {
			b = append(b, ", "...)
		}
		x, y := p.ChipOf(bd)
		b = append(b, '[')
		b = appendInts(b, x, y)
		b = append(b, ", "...)
		info, _ := m.Info(bd)
		b = appendString(b, info.IP)
		b = append(b, ']')
	}
	b = append(b, `], "machine_name": `...)
	b = appendString(b, m.Name)
	b = append(b, `, "boards": `...)
	b = appendBoards(b, p)
	return append(b, '}')
}

// appendJobEntry is one entry of list_jobs.
func appendJobEntry(b []byte, j *Job) []byte {
	b = append(b, `{"job_id": `...)
	b = strconv.AppendInt(b, j.ID, 10)
	b = append(b, `, "owner": `...)
	b = appendString(b, j.Owner)
	b = append(b, `, "start_time": `...)
	b = appendTime(b, j.Start)
	b = append(b, `, "keepalive": `...)
	b = appendFloatPtr(b, j.Keepalive)
	b = append(b, `, "state": `...)
	b = strconv.AppendInt(b, int64(j.State), 10)
	b = append(b, `, "power": `...)
	b = appendPower(b, j)
	b = append(b, `, "args": `...)
	b = appendInts(b, j.Args...)
	b = append(b, `, "kwargs": `...)
	if len(j.Kwargs) == 0 {
		b = append(b, "{}"...)
	} else {
		b = append(b, j.Kwargs...)
	}
	b = append(b, `, "allocated_machine_name": `...)
	if j.Placement != nil && j.Machine != "" {
		b = appendString(b, j.Machine)
		b = append(b, `, "boards": `...)
		b = appendBoards(b, j.Placement)
	} else {
		b = append(b, `null, "boards": null`...)
	}
	b = append(b, `, "keepalivehost": `...)
	b = appendString(b, j.KeepaliveHost)
	return append(b, '}')
}

// appendMachineEntry is one entry of list_machines.
func appendMachineEntry(b []byte, m *arbiter.GridMachine) []byte {
	b = append(b, `{"name": `...)
	b = appendString(b, m.Name)
	b = append(b, `, "tags": [`...)
	for i, t := range m.Tags {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendString(b, t)
	}
	b = append(b, `], "width": `...)
	b = strconv.AppendInt(b, int64(m.Width), 10)
	b = append(b, `, "height": `...)
	b = strconv.AppendInt(b, int64(m.Height), 10)
	b = append(b, `, "dead_boards": [`...)
	for i, d := range m.DeadBoards {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendBoard(b, d.X, d.Y, d.Z)
	}
	b = append(b, `], "dead_links": [`...)
	for i, l := range m.DeadLinks {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendInts(b, l.Board.X, l.Board.Y, l.Board.Z, int(l.Link))
	}
	return append(b, "]}"...)
}

// appendWhereIs is where_is's answer.
func appendWhereIs(b []byte, l *location) []byte {
	b = append(b, `{"machine": `...)
	b = appendString(b, l.machine)
	b = append(b, `, "logical": `...)
	b = appendBoard(b, l.logical.X, l.logical.Y, l.logical.Z)
	b = append(b, `, "physical": `...)
	b = appendInts(b, l.physical.Cabinet, l.physical.Frame, l.physical.Board)
	b = append(b, `, "chip": `...)
	b = appendInts(b, l.chip[0], l.chip[1])
	b = append(b, `, "board_chip": `...)
	b = appendInts(b, l.boardChip[0], l.boardChip[1])
	b = append(b, `, "job_id": `...)
	if l.jobID == 0 {
		b = appendNull(b)
	} else {
		b = strconv.AppendInt(b, l.jobID, 10)
	}
	b = append(b, `, "job_chip": `...)
	if l.jobChip == nil {
		b = appendNull(b)
	} else {
		b = appendInts(b, l.jobChip[0], l.jobChip[1])
	}
	return append(b, '}')
}
