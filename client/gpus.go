package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// GPU ground truth (docs/reference/gpu-truth.md): the agent's report and orders,
// single-GPU administration and the usage report.

// ReportGPUs sends an agent's GPU report for machine and returns the
// engine's orders. Errors: not_found for an unknown machine (register it),
// invalid for a report the server refuses, unavailable when the machine
// reports too often.
func (c *Client) ReportGPUs(ctx context.Context, machine string, r arbiter.GPUReport) (arbiter.GPUOrders, error) {
	return send[arbiter.GPUOrders](ctx, c, http.MethodPost, clientGPUsPath(machine)+"/report", nil, r)
}

// WaitGPUOrders is one long-poll for machine's orders: it returns once an
// event concerning the machine comes after since, or after wait (capped at
// 300s), or at once when wait is 0 or since is negative. Errors: not_found
// for an unknown machine.
func (c *Client) WaitGPUOrders(ctx context.Context, machine string, since int64, wait time.Duration) (arbiter.GPUOrders, error) {
	q := url.Values{}
	if since >= 0 {
		q.Set("since", strconv.FormatInt(since, 10))
	}
	if wait > 0 {
		wait = min(wait, maxWait)
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	var out arbiter.GPUOrders
	err := c.doWait(ctx, http.MethodGet, clientGPUsPath(machine)+"/orders", q, nil, &out, wait)
	return out, err
}

// SetGPUDrained drains (true) or undrains one GPU of a machine, recording
// reason. Errors: not_found for an unknown machine or GPU, forbidden
// without the admin role.
func (c *Client) SetGPUDrained(ctx context.Context, machine string, index int, drained bool, reason string) (arbiter.MachineStatus, error) {
	verb := "/undrain"
	if drained {
		verb = "/drain"
	}
	var q url.Values
	if reason != "" {
		q = url.Values{"reason": {reason}}
	}
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, clientGPUsPath(machine)+"/"+strconv.Itoa(index)+verb, q, nil)
}

// FreeGPU ends one GPU's releasing and unhealthy states at once: an
// admin's word that it is clean and well. Errors: as SetGPUDrained.
func (c *Client) FreeGPU(ctx context.Context, machine string, index int) (arbiter.MachineStatus, error) {
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, clientGPUsPath(machine)+"/"+strconv.Itoa(index)+"/free", nil, nil)
}

// Usage returns the GPU-hours report: since and until are days
// (YYYY-MM-DD, both included; "" for the server's defaults, the last 30
// days), by is owner, machine, model or day ("" for owner). Errors:
// invalid for a bad range or grouping.
func (c *Client) Usage(ctx context.Context, since, until, by string) (arbiter.UsageReport, error) {
	q := url.Values{}
	for k, v := range map[string]string{"since": since, "until": until, "by": by} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return send[arbiter.UsageReport](ctx, c, http.MethodGet, "/api/v1/usage", q, nil)
}

func clientGPUsPath(machine string) string {
	return "/api/v1/machines/" + url.PathEscape(machine) + "/gpus"
}
