package ui

import (
	"bytes"
	"context"
	"html"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// panel is one panel of the dashboard: a template block "panel-<name>" in
// ui/templates and a data source here. Adding a capability's panel is one
// entry in panels, one data function and one template block; the page
// lays panels out by their CSS class "panel-<name>" (ui/static/app.css).
type panel struct {
	name string
	// kinds are the prefixes of the event kinds after which the panel is
	// rendered again ("allocation." …; "" matches every event).
	kinds []string
	// data returns what the template block sees as .D, and whether the
	// panel is shown at all: a capability that is not configured (no
	// records of its kind, say) shows no panel rather than an empty one.
	data func(v *view) (any, bool)
}

// panels are the dashboard's panels in page order.
var panels = []panel{
	{"locks", []string{"lock."}, locksData}, // caps.go
	{"summary", []string{"machine.", "allocation.", "gpu."}, summaryData},
	{"machines", []string{"machine.", "allocation.", "gpu."}, machinesData},
	{"queue", []string{"allocation."}, queueData},
	{"fairshare", []string{"allocation.", "quota."}, fairshareData},             // fairshare.go
	{"reservations", []string{"reservation.", "allocation."}, reservationsData}, // fairshare.go
	{"live", []string{"allocation."}, liveData},
	{"services", []string{"service.", "catalog.", "lock.", "machine.", // coord.go
		arbiter.EventSwapPending, arbiter.EventSwapRunning, arbiter.EventSwapComplete, arbiter.EventSwapFailed}, servicesData},
	{"pools", []string{"allocation.", "pool."}, poolsData},
	{"tasks", []string{"task."}, tasksData},
	{"history", []string{"allocation.destroyed"}, historyData},
	{"events", []string{""}, eventsData},
	{"schedules", []string{"schedule."}, schedulesData},
	// Also refreshed when the delivery log changes: the stream's "stale" frame.
	{"deliveries", []string{"webhook."}, deliveriesData},
}

func panelNamed(name string) *panel {
	for i := range panels {
		if panels[i].name == name {
			return &panels[i]
		}
	}
	return nil
}

// Panels names the dashboard's panels in page order.
func Panels() []string {
	names := make([]string, len(panels))
	for i := range panels {
		names[i] = panels[i].name
	}
	return names
}

// view is one rendering of the dashboard for one caller: what every panel
// template sees (as .V, and promoted: .Admin, .Now …). Reads from the plane
// are made once per rendering and shared by the panels.
type view struct {
	ctx    context.Context
	plane  Reader
	Caller arbiter.Caller
	Admin  bool
	Now    time.Time

	machines []arbiter.MachineStatus
	allocs   []arbiter.Allocation
	haveM    bool
	haveA    bool
	colors   map[string]string     // owner → colour class, see OwnerClass
	holders  map[int64]*cellHolder // allocation → its compact cells' text (compact.go)

	deliveries arbiter.DeliveryLog // the webhook delivery log, nil when none
}

func (u *Dashboard) newView(r *http.Request, c arbiter.Caller) *view {
	return &view{
		ctx: r.Context(), plane: u.plane, Caller: c,
		Admin:      c.Role == arbiter.RoleAdmin,
		Now:        u.now().UTC().Truncate(time.Millisecond),
		deliveries: u.deliveries,
	}
}

// Machines returns the machines in name order.
func (v *view) Machines() []arbiter.MachineStatus {
	if !v.haveM {
		v.machines = v.plane.Machines()
		sort.SliceStable(v.machines, func(i, j int) bool { return v.machines[i].Name < v.machines[j].Name })
		v.haveM = true
	}
	return v.machines
}

// Allocations returns every allocation the plane knows, live and retired,
// in id order.
func (v *view) Allocations() []arbiter.Allocation {
	if !v.haveA {
		v.allocs = v.plane.Allocations(arbiter.AllocationFilter{})
		v.haveA = true
	}
	return v.allocs
}

// OwnerClass returns the colour class of an owner ("o0" … "o15"). Each owner
// has a colour of its own from a hash of its name; when two owners holding
// or waiting now would share one, the later comer (by allocation id) takes
// the next free colour, so up to sixteen owners on the page never look alike.
func (v *view) OwnerClass(owner string) string {
	if v.colors == nil {
		v.colors = map[string]string{}
		var taken [ownerPalette]bool
		for _, a := range v.Allocations() {
			if !a.Live() {
				continue
			}
			if _, ok := v.colors[a.Owner]; ok {
				continue
			}
			h := ownerHash(a.Owner)
			slot := h
			for i := 0; i < ownerPalette; i++ {
				if s := (h + i) % ownerPalette; !taken[s] {
					slot = s
					break
				}
			}
			taken[slot] = true
			v.colors[a.Owner] = "o" + itoa(slot)
		}
	}
	if c, ok := v.colors[owner]; ok {
		return c
	}
	return ownerClass(owner)
}

// release is what the "release" block shows of an allocation's button.
type release struct {
	ID      int64
	Owner   string
	Queued  bool   // "Cancel" rather than "Release"
	Devices string // "gpu1: 0–3", "" while queued
	Forced  bool   // not the caller's own: the admin's power, marked .admin
}

// release returns the release button of a for the caller, or nil when the
// caller may not release it: an admin may release any, a user the ones
// their token created, an agent none.
func (v *view) release(a *arbiter.Allocation) *release {
	own := v.Caller.Name != "" && a.Principal == v.Caller.Name
	if !a.Live() || !(v.Admin || (v.Caller.Role == arbiter.RoleUser && own)) {
		return nil
	}
	r := &release{ID: a.ID, Owner: a.Owner, Queued: a.State == arbiter.StateQueued, Forced: v.Admin && !own}
	if len(a.Devices) > 0 || len(a.Boards) > 0 {
		r.Devices = holds(*a)
	}
	return r
}

// block is what a panel's template block sees: the view, and .D.
type block struct {
	*view
	D any
}

// renderPanel renders one panel; show is false for a panel that is absent.
func (u *Dashboard) renderPanel(v *view, p *panel) (template.HTML, bool, error) {
	d, show := p.data(v)
	if !show {
		return "", false, nil
	}
	var b bytes.Buffer
	// As large as the panel's last rendering: a large fleet's machines
	// panel is megabytes, and growing to it copies it over and over.
	if n, ok := u.panelSizes.Load(p.name); ok {
		b.Grow(n.(int) + n.(int)/8)
	}
	if err := u.pages.ExecuteTemplate(&b, "panel-"+p.name, block{v, d}); err != nil {
		return "", false, err
	}
	u.panelSizes.Store(p.name, b.Len())
	// The template's own escaped output.
	return template.HTML(b.String()), true, nil //nolint:gosec
}

// Summary: GPUs free and held, who holds how many, what waits.

type summary struct {
	Machines, Up, Down, Draining int
	GPUs, Held, Free             int
	FreeUp                       int // free on machines that take new work
	// Boards of grid machines: how many, held, free (neither held nor dead).
	Boards, BoardsHeld, BoardsFree int
	Queued, Live                   int
	Owners                         []ownerCount
}

type ownerCount struct {
	Owner  string
	GPUs   int
	Boards int
	Allocs int
}

func summaryData(v *view) (any, bool) {
	var d summary
	for _, m := range v.Machines() {
		d.Machines++
		switch m.State {
		case arbiter.MachineDown:
			d.Down++
		case arbiter.MachineDraining:
			d.Draining++
		default:
			d.Up++
		}
		if m.Kind == arbiter.KindGrid {
			d.Boards += len(m.Devices)
			d.BoardsFree += m.Free
			for _, dv := range m.Devices {
				if dv.Allocation != nil {
					d.BoardsHeld++
				}
			}
			continue
		}
		d.GPUs += len(m.Devices)
		d.Free += m.Free
		if m.State == arbiter.MachineUp {
			d.FreeUp += m.Free
		}
		for _, dv := range m.Devices {
			if dv.Allocation != nil { // releasing, unhealthy or drained GPUs are not free, nor held
				d.Held++
			}
		}
	}
	owners := map[string]*ownerCount{}
	for _, a := range v.Allocations() {
		switch {
		case a.State == arbiter.StateQueued:
			d.Queued++
		case a.Live():
			d.Live++
			o := owners[a.Owner]
			if o == nil {
				o = &ownerCount{Owner: a.Owner}
				owners[a.Owner] = o
			}
			o.GPUs += len(a.Devices)
			o.Boards += len(a.Boards)
			o.Allocs++
		}
	}
	for _, o := range owners {
		d.Owners = append(d.Owners, *o)
	}
	sort.Slice(d.Owners, func(i, j int) bool {
		if d.Owners[i].GPUs != d.Owners[j].GPUs {
			return d.Owners[i].GPUs > d.Owners[j].GPUs
		}
		if d.Owners[i].Boards != d.Owners[j].Boards {
			return d.Owners[i].Boards > d.Owners[j].Boards
		}
		return d.Owners[i].Owner < d.Owners[j].Owner
	})
	return d, true
}

// Machines: each machine and its GPUs as a grid of tiles, or for a large
// fleet each GPU machine as a compact row (compact.go).

type machine struct {
	arbiter.MachineStatus
	Held   int
	Models string // "8 × H100 80GB HBM3 · 80 GiB"
	Mixed  bool   // GPUs of more than one model: each tile names its own
	// Tiles is the markup of the GPUs' tiles. They are most of the page, so
	// they are written here (tile.write) rather than by the template,
	// whose every action costs reflection: a fleet of 1,000 hosts renders
	// several times faster.
	Tiles template.HTML
	// Row is the markup of a GPU machine's compact row, written instead of
	// the tiles for a large fleet (CompactAt, compact.go).
	Row template.HTML
	Map *boardMap // a grid machine's boards (grid.go)
}

// tile is one GPU's tile.
type tile struct {
	DOMID   string // "g-gpu1-0"
	Index   int
	Class   string // "gpu held o3 idle", "gpu unhealthy", "gpu releasing"
	Title   string // every detail, on hover
	Model   string // "H100 · 80 GiB" on a mixed machine's tiles, else ""
	Held    bool
	Owner   string        // the holder
	ID      int64         // the holder's allocation
	Since   template.HTML // <time> it got the GPU
	KA      template.HTML // <time> of its last keepalive; "" when it never expires
	State   string        // free, held, releasing, unhealthy, drained (docs/reference/gpu-truth.md)
	Reason  string        // why it is releasing, unhealthy or drained
	Idle    bool          // its holder's GPUs have all been idle long enough to say so
	Foreign bool          // a process no live allocation accounts for is on it
	// Use is its latest sample, "87% · 59.8/79.6 GiB", with UseClass the
	// utilisation's tenth for the bar ("u9"); "" without a sample.
	Use, UseClass string
	Procs         []arbiter.GPUProcess
}

func machinesData(v *view) (any, bool) {
	live := map[int64]*arbiter.Allocation{}
	as := v.Allocations()
	for i := range as {
		if as[i].Live() {
			live[as[i].ID] = &as[i]
		}
	}
	ms := v.Machines()
	out := make([]machine, 0, len(ms))
	compact := compactCount(ms) > CompactAt
	for _, m := range ms {
		if m.Kind == arbiter.KindGrid && m.Grid != nil {
			um := machine{MachineStatus: m, Map: v.boardMap(&m, live)}
			um.Held = um.Map.Held
			um.Models = arbiter.Plural(m.Grid.Width*m.Grid.Height, "triad") + " (" + itoa(m.Grid.Width) + " × " + itoa(m.Grid.Height) +
				") · " + arbiter.Plural(len(m.Devices), "board")
			out = append(out, um)
			continue
		}
		um := machine{MachineStatus: m, Models: models(m.Devices)}
		for _, dv := range m.Devices {
			if dv.Allocation != nil {
				um.Held++
			}
		}
		if compact && m.Kind == arbiter.KindGPU {
			um.Row = v.compactRow(&m, um.Models, live) // compact.go
			out = append(out, um)
			continue
		}
		for _, d := range m.Devices {
			if d.Model != m.Devices[0].Model || d.VRAMGiB != m.Devices[0].VRAMGiB {
				um.Mixed = true
			}
		}
		var b strings.Builder
		for _, d := range m.Devices {
			t := v.tile(&d, live)
			t.DOMID = "g-" + m.Name + "-" + itoa(d.Index)
			if !um.Mixed {
				t.Model = ""
			}
			t.write(&b)
		}
		um.Tiles = template.HTML(b.String())
		out = append(out, um)
	}
	return machines{List: out, Compact: compact}, true
}

// write appends the tile's <li> to b, every text escaped.
func (t *tile) write(b *strings.Builder) {
	esc := html.EscapeString
	b.WriteString("\n    <li id=\"" + esc(t.DOMID) + "\" class=\"" + esc(t.Class) + "\" title=\"" + esc(t.Title) + "\">\n")
	b.WriteString(`      <span class="gpu-top"><span class="gpu-idx">GPU ` + itoa(t.Index) + `</span>`)
	if t.Model != "" {
		b.WriteString(`<span class="gpu-model">` + esc(t.Model) + `</span>`)
	}
	if t.Idle {
		b.WriteString(`<span class="flag flag-idle">idle</span>`)
	}
	if t.Foreign {
		b.WriteString(`<span class="flag flag-foreign">unmanaged</span>`)
	}
	b.WriteString("</span>\n")
	switch {
	case t.Held:
		b.WriteString(`      <span class="gpu-owner">` + esc(t.Owner) + "</span>\n")
		b.WriteString(`      <span class="gpu-line">#` + strconv.FormatInt(t.ID, 10) + `<span class="gpu-since"> · ` + string(t.Since) + "</span></span>\n")
		switch {
		case t.State == arbiter.GPUDrained || t.State == arbiter.GPUUnhealthy:
			b.WriteString(`      <span class="gpu-line gpu-why">` + esc(t.State+": "+t.Reason) + "</span>\n")
		case t.KA != "":
			b.WriteString(`      <span class="gpu-line gpu-ka">alive ` + string(t.KA) + "</span>\n")
		default:
			b.WriteString(`      <span class="gpu-line gpu-ka">no keepalive</span>` + "\n")
		}
	default:
		b.WriteString(`      <span class="gpu-owner gpu-state">` + esc(t.State) + "</span>\n")
		b.WriteString(`      <span class="gpu-line gpu-why">` + esc(t.Reason) + "</span>\n")
		b.WriteString(`      <span class="gpu-line"></span>` + "\n")
	}
	b.WriteString(`      <span class="gpu-use">`)
	if t.Use != "" {
		b.WriteString(`<span class="bar ` + t.UseClass + `" aria-hidden="true"></span><span class="use-text">` + esc(t.Use) + `</span>`)
	}
	if len(t.Procs) > 0 {
		b.WriteString(`<details class="gpu-procs"><summary title="its processes">` + esc(arbiter.Plural(len(t.Procs), "proc")) + `</summary><ul>`)
		for _, p := range t.Procs {
			b.WriteString("<li>" + esc(procText(p)) + "</li>")
		}
		b.WriteString(`</ul></details>`)
	}
	b.WriteString("</span>\n    </li>")
}

func (v *view) tile(d *arbiter.DeviceStatus, live map[int64]*arbiter.Allocation) tile {
	t := tile{Index: d.Index, Model: shortModel(d.Model) + " · " + gib(d.VRAMGiB), State: deviceState(d), Reason: d.StateReason, Foreign: d.Unmanaged}
	var title strings.Builder
	title.WriteString("GPU " + itoa(d.Index) + " · " + d.Model + " · " + gib(d.VRAMGiB))
	if d.Compute != "" {
		title.WriteString(" · compute " + d.Compute)
	}
	if d.UUID != "" {
		title.WriteString(" · " + d.UUID)
	}
	if t.State != arbiter.GPUFree && t.State != arbiter.GPUHeld {
		title.WriteString(" · " + t.State)
		if t.Reason != "" {
			title.WriteString(": " + t.Reason)
		}
	}
	if u := d.Usage; u != nil {
		t.Use, t.UseClass = useText(u)
		t.Procs = u.Processes
		title.WriteString("\n" + t.Use + " · sampled " + ago(v.Now, u.SampledAt))
		for _, p := range u.Processes {
			title.WriteString("\n" + procText(p))
		}
	}
	if t.Foreign {
		title.WriteString("\nin use by a process no allocation accounts for: nothing new is placed on it")
	}
	var a *arbiter.Allocation
	if d.Allocation != nil {
		a = live[*d.Allocation]
	}
	t.Class = "gpu " + t.State
	if a != nil {
		t.Held, t.Owner, t.ID = true, arbiter.ShortOwner(a.Owner), a.ID
		t.Class = "gpu held " + v.OwnerClass(a.Owner)
		if t.State != arbiter.GPUHeld {
			t.Class += " " + t.State // held, but drained or unhealthy
		}
		t.Since = relTime(v.Now, d.Since)
		if ka := lastKeepalive(a); ka != nil {
			t.KA = relTimeAttrs(v.Now, *ka, "data-ka", strconv.FormatInt(a.ID, 10), "data-interval", num(a.KeepaliveS))
		}
		if a.IdleSince != nil {
			t.Idle = true
			t.Class += " idle"
			title.WriteString("\nits holder's GPUs have been idle since " + abs(*a.IdleSince))
		}
	}
	if t.Foreign {
		t.Class += " foreign"
	}
	t.Title = title.String()
	return t
}

// deviceState is the GPU's state (docs/reference/gpu-truth.md), or, for a
// status that carries none, the one its holder and health imply.
func deviceState(d *arbiter.DeviceStatus) string {
	switch {
	case d.State != "":
		return d.State
	case !d.Healthy:
		return arbiter.GPUUnhealthy
	case d.Allocation != nil:
		return arbiter.GPUHeld
	}
	return arbiter.GPUFree
}

// useText is a GPU sample as a tile shows it, "87% · 59.8/80 GiB" (no
// memory while none is used), and the class of its utilisation bar ("u0"
// … "u10", "u-" when unknown).
func useText(u *arbiter.GPUUsage) (string, string) {
	pct, class := "?%", "u-"
	if u.UtilPct != nil {
		pct, class = itoa(*u.UtilPct)+"%", "u"+itoa(min(max(*u.UtilPct, 0), 100)/10)
	}
	if u.MemUsedMiB <= 0 {
		return pct, class
	}
	mem := strconv.FormatFloat(float64(u.MemUsedMiB)/1024, 'f', 1, 64)
	if u.MemTotalMiB > 0 {
		mem += "/" + strconv.FormatFloat(float64(u.MemTotalMiB)/1024, 'f', 0, 64)
	}
	return pct + " · " + mem + " GiB", class
}

// procText is one process as the tiles list it: "pid 4242 · alice ·
// 59.6 GiB · python train.py · allocation 17" (or "not attributed").
func procText(p arbiter.GPUProcess) string {
	s := "pid " + itoa(p.PID)
	if p.User != "" {
		s += " · " + p.User
	}
	s += " · " + strconv.FormatFloat(float64(p.MemMiB)/1024, 'f', 1, 64) + " GiB"
	if p.Command != "" {
		s += " · " + arbiter.Clip(p.Command, 60)
	}
	if p.Allocation != nil {
		return s + " · allocation " + strconv.FormatInt(*p.Allocation, 10)
	}
	return s + " · not attributed"
}

// lastKeepalive is when a's holder last showed signs of life, as the
// keepalive deadline tells it; nil for an allocation that never expires.
func lastKeepalive(a *arbiter.Allocation) *time.Time {
	if a.KeepaliveS == nil || a.ExpiresAt == nil {
		return nil
	}
	t := a.ExpiresAt.Add(-time.Duration(*a.KeepaliveS * float64(time.Second)))
	return &t
}

// models summarises a machine's GPUs: "8 × H100 80GB HBM3 · 80 GiB", or
// several such parts for a mixed machine.
func models(ds []arbiter.DeviceStatus) string {
	type key struct {
		model string
		vram  float64
	}
	var order []key
	count := map[key]int{}
	for _, d := range ds {
		k := key{shortModel(d.Model), d.VRAMGiB}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	parts := make([]string, 0, len(order))
	for _, k := range order {
		parts = append(parts, itoa(count[k])+" × "+k.model+" · "+gib(k.vram))
	}
	if len(parts) == 0 {
		return "no GPUs"
	}
	return strings.Join(parts, ", ")
}

// Queue: what waits, in the order the engine will serve it.

type queued struct {
	arbiter.Allocation
	Pos   string // the engine's queue position; "–" for one it gives none (a pool slot waiting for its backing)
	Rel   *release
	Group string // its group and factor (fairshare.go)
}

// queue is the queue panel: the waiting requests, and whether any has a
// group (else the column is left out: no groups are configured).
type queue struct {
	Rows   []queued
	Groups bool
}

func queueData(v *view) (any, bool) {
	var q queue
	st := v.standings()
	for _, a := range v.Allocations() {
		if a.State == arbiter.StateQueued {
			r := queued{Allocation: a, Group: v.queueGroup(&a, st), Pos: "–"}
			if a.Position != nil {
				r.Pos = strconv.Itoa(*a.Position)
			}
			q.Groups = q.Groups || r.Group != ""
			q.Rows = append(q.Rows, r)
		}
	}
	// The engine's order, by its positions; what it gives none (a pool
	// slot, served with its backing) after, higher priority then oldest
	// first.
	sort.SliceStable(q.Rows, func(i, j int) bool {
		a, b := &q.Rows[i], &q.Rows[j]
		switch {
		case a.Position != nil && b.Position != nil:
			return *a.Position < *b.Position
		case (a.Position != nil) != (b.Position != nil):
			return a.Position != nil
		case a.Priority != b.Priority:
			return a.Priority > b.Priority
		case !a.CreatedAt.Equal(b.CreatedAt):
			return a.CreatedAt.Before(b.CreatedAt)
		}
		return a.ID < b.ID
	})
	for i := range q.Rows {
		q.Rows[i].Rel = v.release(&q.Rows[i].Allocation)
	}
	return q, true
}

// Live: allocations that hold devices (or are being powered).

type live struct {
	*arbiter.Allocation
	Class   string        // the owner's colour
	Devices string        // "gpu1: 0–3"
	Since   template.HTML // <time> it became ready
	KA      template.HTML // <time> of the last keepalive; "" when it never expires
	Rel     *release
	PowerS  *badge // a grid allocation's power state
}

// badge is a badge's text and class.
type badge struct{ Text, Class string }

func liveData(v *view) (any, bool) {
	var out []live
	as := v.Allocations()
	for i := range as {
		a := &as[i]
		if !a.Live() || a.State == arbiter.StateQueued {
			continue
		}
		l := live{Allocation: a, Class: v.OwnerClass(a.Owner), Devices: holds(*a), Since: relTime(v.Now, a.ReadyAt), Rel: v.release(a)}
		if ka := lastKeepalive(a); ka != nil {
			l.KA = relTimeAttrs(v.Now, *ka, "data-ka", strconv.FormatInt(a.ID, 10), "data-interval", num(a.KeepaliveS))
		}
		if len(a.Boards) > 0 {
			p := power(a, false)
			l.PowerS = &badge{"power " + p, "badge-" + powerClass(p)}
		}
		out = append(out, l)
	}
	return out, true
}

// History: the most recently ended allocations with their reasons.

const historyRows = 20

type history struct {
	Rows  []arbiter.Allocation
	Total int
}

func historyData(v *view) (any, bool) {
	var d history
	for _, a := range v.Allocations() {
		if !a.Live() {
			d.Rows = append(d.Rows, a)
		}
	}
	d.Total = len(d.Rows)
	sort.SliceStable(d.Rows, func(i, j int) bool {
		ti, tj := ended(&d.Rows[i]), ended(&d.Rows[j])
		if !ti.Equal(tj) {
			return ti.After(tj)
		}
		return d.Rows[i].ID > d.Rows[j].ID
	})
	if len(d.Rows) > historyRows {
		d.Rows = d.Rows[:historyRows]
	}
	return d, true
}

func ended(a *arbiter.Allocation) time.Time {
	if a.DestroyedAt != nil {
		return *a.DestroyedAt
	}
	return a.CreatedAt
}

// Events: the latest events, newest first; the page renders it again after
// every event.

const eventRows = 30

// eventScan is how many of the latest events are read for those rows: a
// swap's output lines (swap.log, shown by the services panel's log) are left
// out, and a running swap makes many.
const eventScan = 150

type events struct {
	Rows []event
	Err  string
}

type event struct {
	arbiter.Event
	Summary string
}

func eventsData(v *view) (any, bool) {
	var d events
	last := v.plane.LastSeq()
	if last == 0 {
		return d, true
	}
	ctx, cancel := context.WithTimeout(v.ctx, 5*time.Second)
	defer cancel()
	evs, err := v.plane.Events(ctx, max(0, last-eventScan), eventScan)
	if err != nil {
		d.Err = "the latest events could not be read: " + arbiter.ErrorMessage(err)
		return d, true
	}
	for _, ev := range evs {
		if ev.Kind != arbiter.EventSwapLog && arbiter.EventVisible(v.Caller, &ev) {
			d.Rows = append(d.Rows, event{Event: ev, Summary: arbiter.EventSummary(ev)})
		}
	}
	if len(d.Rows) > eventRows {
		d.Rows = d.Rows[len(d.Rows)-eventRows:]
	}
	for i, j := 0, len(d.Rows)-1; i < j; i, j = i+1, j-1 {
		d.Rows[i], d.Rows[j] = d.Rows[j], d.Rows[i]
	}
	return d, true
}
