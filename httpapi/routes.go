package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// srvRoute is one route of the native API. srvRoutes is the only list: the
// mux is built from it and the OpenAPI test checks the document against it.
type srvRoute struct {
	method string
	path   string
	roles  srvRoles
	handle srvHandlerFunc
}

func (rt *srvRoute) pattern() string { return rt.method + " " + rt.path }

var srvRoutes = []srvRoute{
	{http.MethodGet, "/api/v1/health", srvPublic, (*Server).handleHealth},
	{http.MethodGet, "/api/v1/openapi.json", srvPublic, (*Server).handleOpenAPI},
	{http.MethodGet, "/metrics", srvPublic, (*Server).handleMetrics},
	{http.MethodGet, "/api/v1/whoami", srvAnyRole, (*Server).handleWhoami},

	{http.MethodGet, "/api/v1/machines", srvAnyRole, (*Server).handleMachines},
	{http.MethodPost, "/api/v1/machines", srvRoleAgent | srvRoleAdmin, (*Server).handleRegisterMachine},
	{http.MethodGet, "/api/v1/machines/{name}", srvAnyRole, (*Server).handleMachine},
	{http.MethodPost, "/api/v1/machines/{name}/heartbeat", srvRoleAgent | srvRoleAdmin, (*Server).handleHeartbeat},
	{http.MethodPost, "/api/v1/machines/{name}/drain", srvRoleAdmin, (*Server).handleDrain},
	{http.MethodPost, "/api/v1/machines/{name}/undrain", srvRoleAdmin, (*Server).handleUndrain},
	// GPU ground truth (gpus.go; specs/gpu-truth.md).
	{http.MethodPost, "/api/v1/machines/{name}/gpus/report", srvRoleAgent | srvRoleAdmin, (*Server).handleGPUReport},
	{http.MethodGet, "/api/v1/machines/{name}/gpus/orders", srvRoleAgent | srvRoleAdmin, (*Server).handleGPUOrders},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/drain", srvRoleAdmin, (*Server).handleGPUDrain},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/undrain", srvRoleAdmin, (*Server).handleGPUUndrain},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/free", srvRoleAdmin, (*Server).handleGPUFree},
	{http.MethodGet, "/api/v1/usage", srvAnyRole, (*Server).handleUsage},

	{http.MethodGet, "/api/v1/allocations", srvAnyRole, (*Server).handleAllocations},
	{http.MethodPost, "/api/v1/allocations", srvRoleUser | srvRoleAdmin, (*Server).handleAllocate},
	{http.MethodGet, "/api/v1/allocations/{id}", srvAnyRole, (*Server).handleAllocation},
	{http.MethodPost, "/api/v1/allocations/{id}/keepalive", srvRoleUser | srvRoleAdmin, (*Server).handleKeepalive},
	{http.MethodDelete, "/api/v1/allocations/{id}", srvRoleUser | srvRoleAdmin, (*Server).handleRelease},

	{http.MethodGet, "/api/v1/events", srvAnyRole, (*Server).handleEvents},

	// Coordination (coord.go, compat_swap.go; specs/coordination.md).
	{http.MethodGet, "/api/v1/locks", srvAnyRole, (*Server).handleLocks},
	{http.MethodGet, "/api/v1/locks/{name}", srvAnyRole, (*Server).handleLock},
	{http.MethodPost, "/api/v1/locks/{name}", srvRoleUser | srvRoleAdmin, (*Server).handleLockAcquire},
	{http.MethodPost, "/api/v1/locks/{name}/extend", srvRoleUser | srvRoleAdmin, (*Server).handleLockExtend},
	{http.MethodDelete, "/api/v1/locks/{name}", srvRoleUser | srvRoleAdmin, (*Server).handleLockRelease},
	{http.MethodGet, "/api/v1/services", srvAnyRole, (*Server).handleServices},
	{http.MethodGet, "/api/v1/services/{name}", srvAnyRole, (*Server).handleService},
	{http.MethodGet, "/api/v1/services/{name}/catalog", srvAnyRole, (*Server).handleCatalog},
	{http.MethodGet, "/api/v1/services/{name}/catalog/{key}", srvAnyRole, (*Server).handleCatalogEntry},
	{http.MethodPut, "/api/v1/services/{name}/catalog/{key}", srvRoleAdmin, (*Server).handleCatalogPut},
	{http.MethodDelete, "/api/v1/services/{name}/catalog/{key}", srvRoleAdmin, (*Server).handleCatalogDelete},
	{http.MethodPost, "/api/v1/services/{name}/catalog/{key}/validate", srvAnyRole, (*Server).handleCatalogValidate},
	{http.MethodPost, "/api/v1/services/{name}/swaps", srvRoleUser | srvRoleAdmin, (*Server).handleSwapRequest},
	{http.MethodGet, "/api/v1/swaps", srvAnyRole, (*Server).handleSwaps},
	{http.MethodGet, "/api/v1/swaps/{id}", srvAnyRole, (*Server).handleSwap},
	{http.MethodGet, "/api/v1/swaps/{id}/stream", srvAnyRole, (*Server).handleSwapStream},
	{http.MethodPost, "/api/v1/swaps/{id}/log", srvRoleAgent | srvRoleAdmin, (*Server).handleSwapLog},
	{http.MethodPost, "/api/v1/swaps/{id}/finish", srvRoleAgent | srvRoleAdmin, (*Server).handleSwapFinish},
	{http.MethodPost, "/api/v1/machines/{name}/swaps/claim", srvRoleAgent | srvRoleAdmin, (*Server).handleSwapClaim},
	{http.MethodGet, "/api/v1/webhooks", srvRoleAdmin, (*Server).handleWebhooks},
	{http.MethodPost, "/api/v1/webhooks", srvRoleAdmin, (*Server).handleWebhookCreate},
	{http.MethodGet, "/api/v1/webhooks/deliveries", srvRoleAdmin, (*Server).handleDeliveries},
	{http.MethodGet, "/api/v1/webhooks/{id}", srvRoleAdmin, (*Server).handleWebhook},
	{http.MethodDelete, "/api/v1/webhooks/{id}", srvRoleAdmin, (*Server).handleWebhookDelete},
	{http.MethodPost, "/api/v1/webhooks/{id}/enable", srvRoleAdmin, (*Server).handleWebhookEnable},
	{http.MethodPost, "/api/v1/webhooks/{id}/disable", srvRoleAdmin, (*Server).handleWebhookDisable},
	{http.MethodGet, "/api/v1/schedules", srvAnyRole, (*Server).handleSchedules},
	{http.MethodPost, "/api/v1/schedules", srvRoleUser | srvRoleAdmin, (*Server).handleScheduleRegister},
	{http.MethodGet, "/api/v1/schedules/{id}", srvAnyRole, (*Server).handleSchedule},
	{http.MethodDelete, "/api/v1/schedules/{id}", srvRoleUser | srvRoleAdmin, (*Server).handleScheduleDelete},
	{http.MethodGet, "/api/swap/lock", srvAnyRole, (*Server).handleCompatLockGet},
	{http.MethodPost, "/api/swap/lock", srvRoleUser | srvRoleAdmin, (*Server).handleCompatLockAcquire},
	{http.MethodDelete, "/api/swap/lock", srvRoleUser | srvRoleAdmin, (*Server).handleCompatLockRelease},
	{http.MethodPost, "/api/swap", srvRoleUser | srvRoleAdmin, (*Server).handleCompatSwap},
	{http.MethodGet, "/api/swap/{id}", srvAnyRole, (*Server).handleCompatSwapGet},
	{http.MethodGet, "/api/swap/{id}/stream", srvAnyRole, (*Server).handleCompatSwapStream},
	{http.MethodPost, "/api/swap/{key}/validate", srvAnyRole, (*Server).handleCompatValidate},
	{http.MethodGet, "/api/schedule", srvAnyRole, (*Server).handleCompatSchedules},
	{http.MethodPost, "/api/schedule", srvRoleUser | srvRoleAdmin, (*Server).handleCompatScheduleRegister},
	{http.MethodDelete, "/api/schedule/{id}", srvRoleUser | srvRoleAdmin, (*Server).handleCompatScheduleDelete},

	{http.MethodPost, "/api/v1/admin/reload", srvRoleAdmin, (*Server).handleAdminReload}, // admin.go

	{http.MethodGet, "/api/v1/pools", srvAnyRole, (*Server).handlePools},
	{http.MethodGet, "/api/v1/pools/{name}", srvAnyRole, (*Server).handlePool},

	// The work queue (tasks.go; specs/fleet.md).
	{http.MethodGet, "/api/v1/tasks", srvAnyRole, (*Server).handleTasks},
	{http.MethodGet, "/api/v1/tasks/summary", srvAnyRole, (*Server).handleTaskSummary},
	{http.MethodPost, "/api/v1/tasks/claim", srvRoleAgent | srvRoleAdmin, (*Server).handleClaimTask},
	{http.MethodPost, "/api/v1/tasks/reload", srvRoleAdmin, (*Server).handleReloadTasks},
	{http.MethodGet, "/api/v1/tasks/{id}", srvAnyRole, (*Server).handleTask},
	{http.MethodPost, "/api/v1/tasks/{id}/heartbeat", srvRoleAgent | srvRoleAdmin, (*Server).handleTaskHeartbeat},
	{http.MethodPost, "/api/v1/tasks/{id}/complete", srvRoleAgent | srvRoleAdmin, (*Server).handleCompleteTask},
	{http.MethodPost, "/api/v1/tasks/{id}/fail", srvRoleAgent | srvRoleAdmin, (*Server).handleFailTask},
	{http.MethodPut, "/api/v1/tasks/{id}/artifact", srvRoleAgent | srvRoleAdmin, (*Server).handleUploadArtifact},
	{http.MethodPost, "/api/v1/tasks/{id}/cancel", srvRoleAdmin, (*Server).handleCancelTask},
	{http.MethodPost, "/api/v1/tasks/{id}/requeue", srvRoleAdmin, (*Server).handleRequeueTask},
	{http.MethodGet, "/api/v1/workers", srvAnyRole, (*Server).handleWorkers},
	{http.MethodGet, "/api/v1/artifacts", srvAnyRole, (*Server).handleArtifacts},
	{http.MethodGet, "/api/v1/artifacts/{id}", srvAnyRole, (*Server).handleArtifact},
	{http.MethodGet, "/api/v1/artifacts/{id}/content", srvAnyRole, (*Server).handleArtifactContent},
	// The fleet's compatible API (fleet.go): its own authentication
	// (X-Lab-Host, X-Operator-Token) and error bodies.
	{http.MethodPost, "/v1/job/claim", srvPublic, (*Server).handleFleetClaim},
	{http.MethodPost, "/v1/job/{id}/heartbeat", srvPublic, (*Server).handleFleetHeartbeat},
	{http.MethodPost, "/v1/job/{id}/complete", srvPublic, (*Server).handleFleetComplete},
	{http.MethodPost, "/v1/job/{id}/fail", srvPublic, (*Server).handleFleetFail},
	{http.MethodPut, "/v1/model/{id}", srvPublic, (*Server).handleFleetUpload},
	{http.MethodGet, "/v1/jobs", srvPublic, (*Server).handleFleetJobs},
	{http.MethodGet, "/v1/workers", srvPublic, (*Server).handleFleetWorkers},
	{http.MethodPost, "/v1/job/{id}/cancel", srvPublic, (*Server).handleFleetCancel},
	{http.MethodPost, "/v1/job/{id}/requeue", srvPublic, (*Server).handleFleetRequeue},
	{http.MethodPost, "/v1/manifest/reload", srvPublic, (*Server).handleFleetReload},
	{http.MethodGet, "/v1/health", srvPublic, (*Server).handleFleetHealth},
}

// srvHealth is the answer of GET /api/v1/health.
type srvHealth struct {
	Status  string    `json:"status"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	LastSeq int64     `json:"last_seq"`
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request, _ arbiter.Caller) error {
	srvWriteJSON(w, http.StatusOK, srvHealth{
		Status:  "ok",
		Version: s.version,
		Time:    time.Now().UTC().Truncate(time.Millisecond),
		LastSeq: s.plane.LastSeq(),
	})
	return nil
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request, _ arbiter.Caller) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.openapi)
	return nil
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if s.metrics == nil {
		return arbiter.Errorf(arbiter.ENotFound, "metrics are not enabled on this server")
	}
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}

// Machines.

func (s *Server) handleMachines(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	ms := s.plane.Machines()
	if ms == nil {
		ms = []arbiter.MachineStatus{}
	}
	srvWriteJSON(w, http.StatusOK, struct {
		Machines []arbiter.MachineStatus `json:"machines"`
	}{ms})
	return nil
}

// srvMachineName returns the {name} path value, checked.
func srvMachineName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if err := arbiter.ValidateName("machine name", name); err != nil {
		return "", err
	}
	return name, nil
}

func (s *Server) handleMachine(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := srvMachineName(r)
	if err != nil {
		return err
	}
	m, ok := s.plane.Machine(name)
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "machine %q is not known: see GET /api/v1/machines", name)
	}
	srvWriteJSON(w, http.StatusOK, m)
	return nil
}

func (s *Server) handleRegisterMachine(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	buf := srvGetBuf()
	defer srvPutBuf(buf)
	if err := srvReadBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	m, err := srvDecodeMachine(buf.Bytes())
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.RegisterMachine{Machine: m})
}

func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := srvMachineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.Heartbeat{Name: name})
}

func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := srvMachineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.SetDraining{Name: name, Draining: true})
}

func (s *Server) handleUndrain(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := srvMachineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.SetDraining{Name: name, Draining: false})
}

// doMachine applies a command whose result is a Machine and answers the
// machine as readers see it.
func (s *Server) doMachine(w http.ResponseWriter, r *http.Request, cmd arbiter.Command) error {
	res, err := s.plane.Do(r.Context(), cmd)
	if err != nil {
		return srvContextError(r.Context(), err)
	}
	var m arbiter.Machine
	switch v := res.(type) {
	case arbiter.Machine:
		m = v
	case *arbiter.Machine:
		m = *v
	default:
		return fmt.Errorf("httpapi: %T returned %T, want arbiter.Machine", cmd, res)
	}
	st, ok := s.plane.Machine(m.Name)
	if !ok {
		// The read view should already hold it once Do returns; should a
		// removal race us, answer what the engine returned.
		st = srvMachineStatus(&m)
	}
	srvWriteJSON(w, http.StatusOK, st)
	return nil
}

// srvMachineStatus describes m with no holders known.
func srvMachineStatus(m *arbiter.Machine) arbiter.MachineStatus {
	st := arbiter.MachineStatus{
		Name: m.Name, Kind: m.Kind, Source: m.Source, State: m.State(), Tags: m.Tags,
		Cores: m.Cores, RAMGiB: m.RAMGiB, CUDA: m.CUDA, Driver: m.Driver,
		Devices: make([]arbiter.DeviceStatus, 0, len(m.GPUs)),
	}
	if !m.LastSeen.IsZero() {
		t := m.LastSeen
		st.LastSeen = &t
	}
	for _, g := range m.GPUs {
		st.Devices = append(st.Devices, arbiter.DeviceStatus{
			Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMGiB: g.VRAMGiB, Compute: g.Compute, Healthy: g.Healthy,
		})
	}
	st.Free = len(st.Devices)
	return st
}

// Allocations.

// srvAllocationStates are the values GET /api/v1/allocations?state= takes.
var srvAllocationStates = map[string]bool{
	arbiter.StateQueued: true, arbiter.StatePower: true, arbiter.StateReady: true,
	arbiter.StateDestroyed: true, "live": true,
}

func (s *Server) handleAllocations(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := srvOnlyParams(q, "state", "owner", "machine"); err != nil {
		return err
	}
	f := arbiter.AllocationFilter{State: q.Get("state"), Owner: q.Get("owner"), Machine: q.Get("machine")}
	if f.State != "" && !srvAllocationStates[f.State] {
		return arbiter.Errorf(arbiter.EInvalid, "state %q is not one of queued, power, ready, destroyed, live", srvClip(f.State, 40))
	}
	if f.Machine != "" {
		if err := arbiter.ValidateName("machine", f.Machine); err != nil {
			return err
		}
	}
	as := s.plane.Allocations(f)
	if as == nil {
		as = []arbiter.Allocation{}
	}
	srvWriteJSON(w, http.StatusOK, struct {
		Allocations []arbiter.Allocation `json:"allocations"`
	}{as})
	return nil
}

func (s *Server) handleAllocate(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	buf := srvGetBuf()
	defer srvPutBuf(buf)
	if err := srvReadBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	req, err := srvDecodeAllocate(buf.Bytes(), c, s.defKeepalive)
	if err != nil {
		return err
	}
	a, err := s.doAllocation(r, arbiter.Allocate{Caller: c, Request: req})
	if err != nil {
		return err
	}
	srvWriteJSON(w, http.StatusCreated, a)
	return nil
}

func (s *Server) handleAllocation(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, err := srvParseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := srvOnlyParams(q, "wait"); err != nil {
		return err
	}
	var wait time.Duration
	if q.Has("wait") {
		if wait, err = srvParseWait(q.Get("wait")); err != nil {
			return err
		}
	}
	a, err := s.waitAllocation(w, r, id, wait)
	if err != nil {
		return err
	}
	srvWriteJSON(w, http.StatusOK, a)
	return nil
}

func (s *Server) handleKeepalive(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := srvParseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	a, err := s.doAllocation(r, arbiter.Keepalive{Caller: c, ID: id})
	if err != nil {
		return err
	}
	srvWriteJSON(w, http.StatusOK, a)
	return nil
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := srvParseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := srvOnlyParams(q, "reason"); err != nil {
		return err
	}
	reason := q.Get("reason")
	if len(reason) > srvMaxReasonBytes {
		return arbiter.Errorf(arbiter.EInvalid, "reason is longer than %d bytes", srvMaxReasonBytes)
	}
	if reason == "" {
		by := c.Name
		if by == "" {
			if a, ok := s.plane.Allocation(id); ok {
				by = a.Owner
			}
		}
		if by == "" {
			by = "owner"
		}
		reason = "released by " + by
	}
	a, err := s.doAllocation(r, arbiter.Release{Caller: c, ID: id, Reason: reason})
	if err != nil {
		return err
	}
	srvWriteJSON(w, http.StatusOK, a)
	return nil
}

// doAllocation applies a command whose result is an Allocation.
func (s *Server) doAllocation(r *http.Request, cmd arbiter.Command) (arbiter.Allocation, error) {
	res, err := s.plane.Do(r.Context(), cmd)
	if err != nil {
		return arbiter.Allocation{}, srvContextError(r.Context(), err)
	}
	switch v := res.(type) {
	case arbiter.Allocation:
		return v, nil
	case *arbiter.Allocation:
		return *v, nil
	}
	return arbiter.Allocation{}, fmt.Errorf("httpapi: %T returned %T, want arbiter.Allocation", cmd, res)
}

// srvOnlyParams refuses query parameters other than allowed, so that a typo
// (?stat=ready) is an error rather than a silently unfiltered answer.
func srvOnlyParams(q url.Values, allowed ...string) error {
	for k := range q {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			if len(allowed) == 0 {
				return arbiter.Errorf(arbiter.EInvalid, "unknown query parameter %q: this route takes none", srvClip(k, 40))
			}
			return arbiter.Errorf(arbiter.EInvalid, "unknown query parameter %q: this route takes %s", srvClip(k, 40), strings.Join(allowed, ", "))
		}
	}
	return nil
}
