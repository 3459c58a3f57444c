package arbiter

import (
	"context"
	"fmt"
)

// Command is an instruction to the engine. Transports build commands; the
// control loop applies them one at a time, in order.
type Command interface{ isCommand() }

// Typed is a command whose result has type R. Every command is one: its
// result method names the type Do returns (it is never called).
type Typed[R any] interface {
	Command
	result() R
}

// None is the result of a command that answers nothing but success.
type None struct{}

// Doer applies commands and returns their results once the change they
// made is durable: *control.Loop, and what a transport is given of it.
type Doer interface {
	Do(ctx context.Context, cmd Command) (any, error)
}

// Do applies cmd through d and returns its result as the type the command
// names. Errors: d's (application errors are *Error); a result of another
// type is a bug, returned as an internal error.
func Do[R any](ctx context.Context, d Doer, cmd Typed[R]) (R, error) {
	var zero R
	res, err := d.Do(ctx, cmd)
	if err != nil || res == nil {
		return zero, err
	}
	r, ok := res.(R)
	if !ok {
		return zero, fmt.Errorf("arbiter: %T answered %T, not %T", cmd, res, zero)
	}
	return r, nil
}

// Caller is who sends a command: the token's name and role ("" and RoleAdmin
// when the server runs without tokens on loopback).
type Caller struct {
	Name string
	Role string
}

// Whoami is the answer of GET /api/v1/whoami: who the server takes the
// caller for. Auth is "bearer" (an Authorization header), "cookie" (the
// dashboard's sign-in) or "open" (a server without tokens: everyone is an
// anonymous admin).
type Whoami struct {
	Name string `json:"name"`
	Role string `json:"role"`
	Auth string `json:"auth"`
}

// Roles of a token (docs/architecture.md §2.7).
const (
	RoleAdmin = "admin"
	RoleAgent = "agent"
	RoleUser  = "user"
)

// Allocate asks for devices. Result: Allocation (queued, ready, or destroyed
// at once when it can never fit).
type Allocate struct {
	Caller  Caller
	Request Request
}

// Keepalive refreshes an allocation's keepalive deadline. Result: Allocation.
// Errors: not_found for an unknown id, conflict for a destroyed allocation.
type Keepalive struct {
	Caller Caller
	ID     int64
}

// Release destroys an allocation with a reason. Result: Allocation.
// Errors: not_found, forbidden when the caller neither created it nor is admin.
// Releasing an allocation already destroyed returns it unchanged.
type Release struct {
	Caller Caller
	ID     int64
	Reason string
}

// RegisterMachine adds or updates a machine (an agent's registration, or the
// server's own host). Result: Machine.
type RegisterMachine struct {
	Machine Machine
}

// Heartbeat tells that a machine's agent is alive. Result: Machine.
// Errors: not_found when the server does not know the machine (the agent then
// registers again).
type Heartbeat struct {
	Name string
}

// SetDraining drains or undrains a machine (admin). Result: Machine.
type SetDraining struct {
	Name     string
	Draining bool
}

// SyncConfigMachines makes the configured machines exactly Machines: new ones
// are added, changed ones updated, configured ones no longer listed removed
// (their allocations destroyed). Result: nil.
type SyncConfigMachines struct {
	Machines []Machine
}

// Reconfigure puts a configuration in force as one change, at start and
// on every reload: its machines, pools, [gpus] policy, fair-share policy
// and grid machines, and the end of the dashboard sessions of tokens it no
// longer has; at start its services too (Services nil: left as they are).
// Every part is checked before any takes effect, and the whole is one
// batch: a refused part or a failed save changes nothing, so "the previous
// configuration stays in force" is true. Services go first, so that their
// GPUs on a machine the configuration adds are theirs before the queue's.
// Result: int, how many sessions ended. Errors: what each part's own
// command refuses, and conflict for a grid machine named like a GPU
// machine there would be.
type Reconfigure struct {
	Services  *SyncServices
	Machines  SyncConfigMachines
	Pools     SyncPools
	GPUPolicy SetGPUPolicy
	FairShare SetFairShare
	Grid      SyncGridMachines
	Sessions  EndSessions
}

// Tick lets the engine act on deadlines that have passed. Result: nil.
type Tick struct{}

func (Allocate) isCommand()             {}
func (Allocate) result() Allocation     { return Allocation{} }
func (Keepalive) isCommand()            {}
func (Keepalive) result() Allocation    { return Allocation{} }
func (Release) isCommand()              {}
func (Release) result() Allocation      { return Allocation{} }
func (RegisterMachine) isCommand()      {}
func (RegisterMachine) result() Machine { return Machine{} }
func (Heartbeat) isCommand()            {}
func (Heartbeat) result() Machine       { return Machine{} }
func (SetDraining) isCommand()          {}
func (SetDraining) result() Machine     { return Machine{} }
func (SyncConfigMachines) isCommand()   {}
func (SyncConfigMachines) result() None { return None{} }
func (Reconfigure) isCommand()          {}
func (Reconfigure) result() int         { return 0 }
func (Tick) isCommand()                 {}
func (Tick) result() None               { return None{} }

// LeaveMachine tells that a machine's agent is stopping (SIGTERM): the
// machine is down at once, so nothing new is placed on it, rather than
// after the heartbeat timeout. Its next registration or heartbeat brings it
// up again. Result: Machine. Errors: not_found for an unknown machine;
// conflict for a machine the configuration declares (it has no agent).
type LeaveMachine struct {
	Name string
}

func (LeaveMachine) isCommand()      {}
func (LeaveMachine) result() Machine { return Machine{} }
