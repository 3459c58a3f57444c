package httpapi

import (
	"net/http"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// route is one route of the native API. apiRoutes is the only list: the
// mux is built from it and the OpenAPI test checks the document against it.
type route struct {
	method string
	path   string
	roles  roles
	handle handlerFunc
}

func (rt *route) pattern() string { return rt.method + " " + rt.path }

var apiRoutes = []route{
	{http.MethodGet, "/api/v1/health", publicRoute, (*Server).handleHealth},
	{http.MethodGet, "/api/v1/openapi.json", publicRoute, (*Server).handleOpenAPI},
	{http.MethodGet, "/metrics", publicRoute, (*Server).handleMetrics},
	{http.MethodGet, "/api/v1/whoami", anyRole, (*Server).handleWhoami},

	{http.MethodGet, "/api/v1/machines", anyRole, (*Server).handleMachines},
	{http.MethodPost, "/api/v1/machines", roleAgent | roleAdmin, (*Server).handleRegisterMachine},
	{http.MethodGet, "/api/v1/machines/{name}", anyRole, (*Server).handleMachine},
	{http.MethodPost, "/api/v1/machines/{name}/heartbeat", roleAgent | roleAdmin, (*Server).handleHeartbeat},
	{http.MethodPost, "/api/v1/machines/{name}/leave", roleAgent | roleAdmin, (*Server).handleLeave},
	{http.MethodPost, "/api/v1/machines/{name}/drain", roleAdmin, (*Server).handleDrain},
	{http.MethodPost, "/api/v1/machines/{name}/undrain", roleAdmin, (*Server).handleUndrain},
	// GPU ground truth (gpus.go; docs/reference/gpu-truth.md).
	{http.MethodPost, "/api/v1/machines/{name}/gpus/report", roleAgent | roleAdmin, (*Server).handleGPUReport},
	{http.MethodGet, "/api/v1/machines/{name}/gpus/orders", roleAgent | roleAdmin, (*Server).handleGPUOrders},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/drain", roleAdmin, (*Server).handleGPUDrain},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/undrain", roleAdmin, (*Server).handleGPUUndrain},
	{http.MethodPost, "/api/v1/machines/{name}/gpus/{index}/free", roleAdmin, (*Server).handleGPUFree},
	{http.MethodGet, "/api/v1/usage", anyRole, (*Server).handleUsage},

	{http.MethodGet, "/api/v1/allocations", anyRole, (*Server).handleAllocations},
	{http.MethodPost, "/api/v1/allocations", roleUser | roleAdmin, (*Server).handleAllocate},
	{http.MethodGet, "/api/v1/allocations/{id}", anyRole, (*Server).handleAllocation},
	{http.MethodPost, "/api/v1/allocations/{id}/keepalive", roleUser | roleAdmin, (*Server).handleKeepalive},
	{http.MethodDelete, "/api/v1/allocations/{id}", roleUser | roleAdmin, (*Server).handleRelease},
	// Fair share (fairshare.go; docs/guides/fair-share.md).
	{http.MethodPost, "/api/v1/allocations/{id}/extend", roleUser | roleAdmin, (*Server).handleExtend},
	{http.MethodGet, "/api/v1/quotas", anyRole, (*Server).handleQuotas},
	{http.MethodPost, "/api/v1/quotas", roleAdmin, (*Server).handleQuotaSet},
	{http.MethodDelete, "/api/v1/quotas", roleAdmin, (*Server).handleQuotaDelete},
	{http.MethodGet, "/api/v1/fairshare", anyRole, (*Server).handleFairShare},
	{http.MethodGet, "/api/v1/reservations", anyRole, (*Server).handleReservations},
	{http.MethodPost, "/api/v1/reservations", roleAdmin, (*Server).handleReservationCreate},
	{http.MethodDelete, "/api/v1/reservations/{id}", roleAdmin, (*Server).handleReservationDelete},
	{http.MethodGet, "/api/v1/notifications", roleUser | roleAdmin, (*Server).handleNotifications},
	{http.MethodPost, "/api/v1/notifications", roleUser | roleAdmin, (*Server).handleNotifyCreate},
	{http.MethodDelete, "/api/v1/notifications/{id}", roleUser | roleAdmin, (*Server).handleNotifyDelete},

	{http.MethodGet, "/api/v1/events", anyRole, (*Server).handleEvents},

	// Coordination (coord.go, compat_swap.go; docs/reference/coordination.md).
	{http.MethodGet, "/api/v1/locks", anyRole, (*Server).handleLocks},
	{http.MethodGet, "/api/v1/locks/{name}", anyRole, (*Server).handleLock},
	{http.MethodPost, "/api/v1/locks/{name}", roleUser | roleAdmin, (*Server).handleLockAcquire},
	{http.MethodPost, "/api/v1/locks/{name}/extend", roleUser | roleAdmin, (*Server).handleLockExtend},
	{http.MethodDelete, "/api/v1/locks/{name}", roleUser | roleAdmin, (*Server).handleLockRelease},
	{http.MethodGet, "/api/v1/services", anyRole, (*Server).handleServices},
	{http.MethodGet, "/api/v1/services/{name}", anyRole, (*Server).handleService},
	{http.MethodGet, "/api/v1/services/{name}/catalog", anyRole, (*Server).handleCatalog},
	{http.MethodGet, "/api/v1/services/{name}/catalog/{key}", anyRole, (*Server).handleCatalogEntry},
	{http.MethodPut, "/api/v1/services/{name}/catalog/{key}", roleAdmin, (*Server).handleCatalogPut},
	{http.MethodDelete, "/api/v1/services/{name}/catalog/{key}", roleAdmin, (*Server).handleCatalogDelete},
	{http.MethodPost, "/api/v1/services/{name}/catalog/{key}/validate", anyRole, (*Server).handleCatalogValidate},
	{http.MethodPost, "/api/v1/services/{name}/swaps", roleUser | roleAdmin, (*Server).handleSwapRequest},
	{http.MethodGet, "/api/v1/swaps", anyRole, (*Server).handleSwaps},
	{http.MethodGet, "/api/v1/swaps/{id}", anyRole, (*Server).handleSwap},
	{http.MethodGet, "/api/v1/swaps/{id}/stream", anyRole, (*Server).handleSwapStream},
	{http.MethodPost, "/api/v1/swaps/{id}/log", roleAgent | roleAdmin, (*Server).handleSwapLog},
	{http.MethodPost, "/api/v1/swaps/{id}/finish", roleAgent | roleAdmin, (*Server).handleSwapFinish},
	{http.MethodPost, "/api/v1/swaps/{id}/cancel", roleUser | roleAdmin, (*Server).handleSwapCancel},
	{http.MethodPost, "/api/v1/machines/{name}/swaps/claim", roleAgent | roleAdmin, (*Server).handleSwapClaim},
	{http.MethodGet, "/api/v1/webhooks", roleAdmin, (*Server).handleWebhooks},
	{http.MethodPost, "/api/v1/webhooks", roleAdmin, (*Server).handleWebhookCreate},
	{http.MethodGet, "/api/v1/webhooks/deliveries", roleAdmin, (*Server).handleDeliveries},
	{http.MethodGet, "/api/v1/webhooks/{id}", roleAdmin, (*Server).handleWebhook},
	{http.MethodDelete, "/api/v1/webhooks/{id}", roleAdmin, (*Server).handleWebhookDelete},
	{http.MethodPost, "/api/v1/webhooks/{id}/enable", roleAdmin, (*Server).handleWebhookEnable},
	{http.MethodPost, "/api/v1/webhooks/{id}/disable", roleAdmin, (*Server).handleWebhookDisable},
	{http.MethodGet, "/api/v1/schedules", anyRole, (*Server).handleSchedules},
	{http.MethodPost, "/api/v1/schedules", roleUser | roleAdmin, (*Server).handleScheduleRegister},
	{http.MethodGet, "/api/v1/schedules/{id}", anyRole, (*Server).handleSchedule},
	{http.MethodDelete, "/api/v1/schedules/{id}", roleUser | roleAdmin, (*Server).handleScheduleDelete},
	{http.MethodGet, "/api/swap/lock", anyRole, (*Server).handleCompatLockGet},
	{http.MethodPost, "/api/swap/lock", roleUser | roleAdmin, (*Server).handleCompatLockAcquire},
	{http.MethodDelete, "/api/swap/lock", roleUser | roleAdmin, (*Server).handleCompatLockRelease},
	{http.MethodPost, "/api/swap", roleUser | roleAdmin, (*Server).handleCompatSwap},
	{http.MethodGet, "/api/swap/{id}", anyRole, (*Server).handleCompatSwapGet},
	{http.MethodGet, "/api/swap/{id}/stream", anyRole, (*Server).handleCompatSwapStream},
	{http.MethodPost, "/api/swap/{key}/validate", anyRole, (*Server).handleCompatValidate},
	{http.MethodGet, "/api/schedule", anyRole, (*Server).handleCompatSchedules},
	{http.MethodPost, "/api/schedule", roleUser | roleAdmin, (*Server).handleCompatScheduleRegister},
	{http.MethodDelete, "/api/schedule/{id}", roleUser | roleAdmin, (*Server).handleCompatScheduleDelete},

	{http.MethodPost, "/api/v1/admin/reload", roleAdmin, (*Server).handleAdminReload}, // admin.go
	{http.MethodGet, "/api/v1/audit", roleAdmin, (*Server).handleAudit},               // audit.go

	{http.MethodGet, "/api/v1/pools", anyRole, (*Server).handlePools},
	{http.MethodGet, "/api/v1/pools/{name}", anyRole, (*Server).handlePool},

	// The work queue (tasks.go; docs/reference/fleet.md).
	{http.MethodGet, "/api/v1/tasks", anyRole, (*Server).handleTasks},
	{http.MethodGet, "/api/v1/tasks/summary", anyRole, (*Server).handleTaskSummary},
	{http.MethodPost, "/api/v1/tasks/claim", roleAgent | roleAdmin, (*Server).handleClaimTask},
	{http.MethodPost, "/api/v1/tasks/reload", roleAdmin, (*Server).handleReloadTasks},
	{http.MethodGet, "/api/v1/tasks/{id}", anyRole, (*Server).handleTask},
	{http.MethodPost, "/api/v1/tasks/{id}/heartbeat", roleAgent | roleAdmin, (*Server).handleTaskHeartbeat},
	{http.MethodPost, "/api/v1/tasks/{id}/complete", roleAgent | roleAdmin, (*Server).handleCompleteTask},
	{http.MethodPost, "/api/v1/tasks/{id}/fail", roleAgent | roleAdmin, (*Server).handleFailTask},
	{http.MethodPut, "/api/v1/tasks/{id}/artifact", roleAgent | roleAdmin, (*Server).handleUploadArtifact},
	{http.MethodPost, "/api/v1/tasks/{id}/cancel", roleAdmin, (*Server).handleCancelTask},
	{http.MethodPost, "/api/v1/tasks/{id}/requeue", roleAdmin, (*Server).handleRequeueTask},
	{http.MethodGet, "/api/v1/workers", anyRole, (*Server).handleWorkers},
	{http.MethodGet, "/api/v1/artifacts", anyRole, (*Server).handleArtifacts},
	{http.MethodGet, "/api/v1/artifacts/{id}", anyRole, (*Server).handleArtifact},
	{http.MethodGet, "/api/v1/artifacts/{id}/content", anyRole, (*Server).handleArtifactContent},
	// The fleet's compatible API (fleet.go): its own authentication
	// (auth.go: client certificates or agent tokens for workers, the
	// operator token for operators) and error bodies.
	{http.MethodPost, "/v1/job/claim", fleetWorkerAuth, (*Server).handleFleetClaim},
	{http.MethodPost, "/v1/job/{id}/heartbeat", fleetWorkerAuth, (*Server).handleFleetHeartbeat},
	{http.MethodPost, "/v1/job/{id}/complete", fleetWorkerAuth, (*Server).handleFleetComplete},
	{http.MethodPost, "/v1/job/{id}/fail", fleetWorkerAuth, (*Server).handleFleetFail},
	{http.MethodPut, "/v1/model/{id}", fleetWorkerAuth, (*Server).handleFleetUpload},
	{http.MethodGet, "/v1/jobs", fleetReadAuth, (*Server).handleFleetJobs},
	{http.MethodGet, "/v1/workers", fleetReadAuth, (*Server).handleFleetWorkers},
	{http.MethodPost, "/v1/job/{id}/cancel", fleetOperatorAuth, (*Server).handleFleetCancel},
	{http.MethodPost, "/v1/job/{id}/requeue", fleetOperatorAuth, (*Server).handleFleetRequeue},
	{http.MethodPost, "/v1/manifest/reload", fleetOperatorAuth, (*Server).handleFleetReload},
	{http.MethodGet, "/v1/health", publicRoute, (*Server).handleFleetHealth},
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request, _ arbiter.Caller) error {
	seq := s.plane.LastSeq()
	h := Health{Version: s.version, LastSeq: &seq}
	if s.problem != nil {
		h.Problem = s.problem()
	}
	if s.cluster != nil { // high availability (cluster.go)
		c := s.cluster()
		h.Cluster = &c
	}
	WriteHealth(w, h)
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
	s.metrics.serve(w, r)
	return nil
}

// Machines.

func (s *Server) handleMachines(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	ms := s.plane.Machines()
	if ms == nil {
		ms = []arbiter.MachineStatus{}
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Machines []arbiter.MachineStatus `json:"machines"`
	}{ms})
	return nil
}

// machineName returns the {name} path value, checked.
func machineName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if err := arbiter.ValidateName("machine name", name); err != nil {
		return "", err
	}
	return name, nil
}

func (s *Server) handleMachine(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	m, ok := s.plane.Machine(name)
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "machine %q is not known: see GET /api/v1/machines", name)
	}
	httpio.WriteJSON(w, http.StatusOK, m)
	return nil
}

func (s *Server) handleRegisterMachine(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	m, err := decodeMachine(buf.Bytes())
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.RegisterMachine{Machine: m})
}

func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.Heartbeat{Name: name})
}

// handleLeave: the machine's agent is stopping; the machine is down now.
func (s *Server) handleLeave(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.LeaveMachine{Name: name})
}

func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.SetDraining{Name: name, Draining: true})
}

func (s *Server) handleUndrain(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.SetDraining{Name: name, Draining: false})
}

// doMachine applies a command whose result is a Machine and answers the
// machine as readers see it.
func (s *Server) doMachine(w http.ResponseWriter, r *http.Request, cmd arbiter.Typed[arbiter.Machine]) error {
	m, err := arbiter.Do(r.Context(), s.plane, cmd)
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	st, ok := s.plane.Machine(m.Name)
	if !ok {
		// The read view should already hold it once Do returns; should a
		// removal race us, answer what the engine returned.
		st = machineStatus(&m)
	}
	httpio.WriteJSON(w, http.StatusOK, st)
	return nil
}

// machineStatus describes m with no holders known.
func machineStatus(m *arbiter.Machine) arbiter.MachineStatus {
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

// allocationStates are the values GET /api/v1/allocations?state= takes.
var allocationStates = map[string]bool{
	arbiter.StateQueued: true, arbiter.StatePower: true, arbiter.StateReady: true,
	arbiter.StateDestroyed: true, "live": true,
}

func (s *Server) handleAllocations(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "state", "owner", "machine"); err != nil {
		return err
	}
	f := arbiter.AllocationFilter{State: q.Get("state"), Owner: q.Get("owner"), Machine: q.Get("machine")}
	if f.State != "" && !allocationStates[f.State] {
		return arbiter.Errorf(arbiter.EInvalid, "state %q is not one of queued, power, ready, destroyed, live", arbiter.Clip(f.State, 40))
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
	httpio.WriteJSON(w, http.StatusOK, struct {
		Allocations []arbiter.Allocation `json:"allocations"`
	}{as})
	return nil
}

func (s *Server) handleAllocate(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	req, err := decodeAllocate(buf.Bytes(), c, s.defKeepalive)
	if err != nil {
		return err
	}
	a, err := arbiter.Do(r.Context(), s.plane, arbiter.Allocate{Caller: c, Request: req})
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusCreated, &a)
	return nil
}

func (s *Server) handleAllocation(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "wait"); err != nil {
		return err
	}
	var wait time.Duration
	if q.Has("wait") {
		if wait, err = parseWait(q.Get("wait")); err != nil {
			return err
		}
	}
	a, err := s.waitAllocation(w, r, id, wait)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, &a)
	return nil
}

func (s *Server) handleKeepalive(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	a, err := arbiter.Do(r.Context(), s.plane, arbiter.Keepalive{Caller: c, ID: id})
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, &a)
	return nil
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "reason"); err != nil {
		return err
	}
	reason := q.Get("reason")
	if len(reason) > maxReasonBytes {
		return arbiter.Errorf(arbiter.EInvalid, "reason is longer than %d bytes", maxReasonBytes)
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
	a, err := arbiter.Do(r.Context(), s.plane, arbiter.Release{Caller: c, ID: id, Reason: reason})
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, &a)
	return nil
}
