package control

import (
	"encoding/json"
	"strconv"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// Grid machines in the read view: their statuses are built from the grid
// capability's records (the machines, and where each allocation's boards
// are) and the allocations, so that GET /api/v1/machines lists them with
// their boards as devices.

// gridMachineRecord reads a RecordGridMachine value.
func gridMachineRecord(v any) (grid.MachineRecord, bool) {
	switch r := v.(type) {
	case grid.MachineRecord:
		return r, true
	case *grid.MachineRecord:
		return *r, r != nil
	case json.RawMessage:
		var mr grid.MachineRecord
		return mr, json.Unmarshal(r, &mr) == nil
	}
	return grid.MachineRecord{}, false
}

// gridJobRecord reads a RecordGridJob value.
func gridJobRecord(v any) (grid.JobRecord, bool) {
	switch r := v.(type) {
	case grid.JobRecord:
		return r, true
	case *grid.JobRecord:
		return *r, r != nil
	case json.RawMessage:
		var jr grid.JobRecord
		return jr, json.Unmarshal(r, &jr) == nil
	}
	return grid.JobRecord{}, false
}

// gridStatuses returns the status of every grid machine; v.mu is held.
func (v *view) gridStatuses() []arbiter.MachineStatus {
	recs := v.records[arbiter.RecordGridMachine]
	if len(recs) == 0 {
		return nil
	}
	out := make([]arbiter.MachineStatus, 0, len(recs))
	for _, val := range recs {
		if mr, ok := gridMachineRecord(val); ok {
			out = append(out, v.gridStatus(&mr))
		}
	}
	return out
}

// gridMachine returns one grid machine's status; v.mu is held.
func (v *view) gridMachine(name string) (arbiter.MachineStatus, bool) {
	mr, ok := gridMachineRecord(v.records[arbiter.RecordGridMachine][name])
	if !ok {
		return arbiter.MachineStatus{}, false
	}
	return v.gridStatus(&mr), true
}

func (v *view) gridStatus(mr *grid.MachineRecord) arbiter.MachineStatus {
	m := &mr.Machine
	s := arbiter.MachineStatus{
		Name: m.Name, Kind: arbiter.KindGrid, Source: arbiter.SourceConfig, State: arbiter.MachineUp,
		Tags: m.Tags, Devices: make([]arbiter.DeviceStatus, 0, 3*m.Width*m.Height),
		Grid: &arbiter.GridInfo{Width: m.Width, Height: m.Height, Priority: mr.Priority, Queue: m.Queue,
			DeadBoards: len(m.DeadBoards), DeadLinks: make([]string, len(m.DeadLinks))},
	}
	for i, l := range m.DeadLinks {
		s.Grid.DeadLinks[i] = l.String()
	}
	index := func(b arbiter.Board) int { return (b.X*m.Height+b.Y)*3 + b.Z }
	for x := 0; x < m.Width; x++ {
		for y := 0; y < m.Height; y++ {
			for z := 0; z < 3; z++ {
				b := arbiter.Board{X: x, Y: y, Z: z}
				info, _ := m.Info(b)
				dead := m.Dead(b)
				s.Devices = append(s.Devices, arbiter.DeviceStatus{
					Index: index(b), Model: "board", Healthy: !dead,
					Board: &arbiter.BoardDevice{X: x, Y: y, Z: z, Cabinet: info.Location.Cabinet, Frame: info.Location.Frame,
						Slot: info.Location.Board, IP: info.IP, Dead: dead},
				})
			}
		}
	}
	hold := func(id int64, boards []arbiter.Board, settling bool) {
		a, known := v.allocs[id]
		for _, b := range boards {
			if !arbiter.GridContains(m.Width, m.Height, b) {
				continue
			}
			d := &s.Devices[index(b)]
			hid := id
			d.Allocation = &hid
			if known {
				owner := a.Owner
				d.Owner, d.Since = &owner, a.ReadyAt
			}
			if settling {
				bd := *d.Board
				bd.Settling = true
				d.Board = &bd
			}
		}
	}
	// Live allocations hold their boards; ended ones whose boards are not
	// free yet keep them in their record.
	for id := range v.byMachine[m.Name] {
		if a, ok := v.allocs[id]; ok && a.Live() {
			hold(id, a.Boards, false)
		}
	}
	for key, val := range v.records[arbiter.RecordGridJob] {
		jr, ok := gridJobRecord(val)
		if !ok || jr.Machine != m.Name || jr.FreeAt == nil {
			continue
		}
		id, _ := strconv.ParseInt(key, 10, 64)
		hold(id, jr.Placement.Boards, true)
	}
	for _, d := range s.Devices {
		if d.Allocation == nil && d.Healthy {
			s.Free++
		}
	}
	return s
}
