package ui

import (
	"html"
	"html/template"
	"strconv"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// CompactAt is how many GPU machines the machines panel shows as
// articles of tiles at most. A tile is 5.6rem tall: past a few dozen hosts
// the panel is pages long and slow to render (8,000 tiles for 1,000 hosts
// of 8 GPUs), so a larger fleet shows each GPU machine as one compact row
// with a small square per GPU (machine.Row). 48 hosts of 8 GPUs is still
// a panel one can read tile by tile; grid machines keep their board map.
const CompactAt = 48

// machines is what the machines panel's template sees as .D.
type machines struct {
	List []machine
	// Compact: there are more than CompactAt GPU machines, and
	// each has its Row rather than its Tiles.
	Compact bool
}

// compactCount is how many machines would be shown as compact rows.
func compactCount(ms []arbiter.MachineStatus) int {
	n := 0
	for i := range ms {
		if ms[i].Kind == arbiter.KindGPU {
			n++
		}
	}
	return n
}

// compactRow writes a GPU machine's compact row: name, state, free/total,
// a strip of cells (one per GPU, coloured like the tiles, with every detail
// of a tile in its title), tags, heartbeat and the admin's drain button.
// Like tile.write it writes the markup by hand, every text escaped: a
// fleet of a thousand hosts is a thousand rows and eight thousand cells.
func (v *view) compactRow(m *arbiter.MachineStatus, models string, live map[int64]*arbiter.Allocation) template.HTML {
	esc := html.EscapeString
	name := esc(m.Name)
	state := esc(m.State)
	var b strings.Builder
	b.Grow(512 + 360*len(m.Devices))
	b.WriteString(`<article class="mrow state-` + state + `" id="m-` + name + `" aria-labelledby="mh-` + name + `">` + "\n")
	b.WriteString(`  <h3 id="mh-` + name + `" class="mrow-name" title="` + name + ` · ` + esc(models) + `">` + name + "</h3>\n")
	b.WriteString(`  <span class="badge badge-` + state + `">` + state + "</span>\n")
	b.WriteString(`  <span class="free-count"><strong>` + itoa(m.Free) + `</strong>/` + itoa(len(m.Devices)) + "</span>\n")
	b.WriteString(`  <ol class="cells" aria-label="GPUs of ` + name + `">`)
	for i := range m.Devices {
		v.writeCell(&b, name, &m.Devices[i], live)
	}
	b.WriteString("</ol>\n")
	b.WriteString(`  <span class="tags"`)
	if len(m.Tags) > 0 {
		tags := esc(strings.Join(m.Tags, ", "))
		b.WriteString(` title="tags: ` + tags + `">`)
		for _, t := range m.Tags {
			b.WriteString(`<span class="tag">` + esc(t) + `</span>`)
		}
	} else {
		b.WriteString(">")
	}
	b.WriteString("</span>\n")
	switch {
	case m.Source == arbiter.SourceAgent && m.LastSeen != nil:
		b.WriteString(`  <span class="seen" title="last heartbeat">` + string(relTimeAttrs(v.Now, *m.LastSeen, "data-seen", m.Name)) + "</span>\n")
	case m.Source == arbiter.SourceAgent:
		b.WriteString(`  <span class="seen" title="last heartbeat">never</span>` + "\n")
	case m.Source == arbiter.SourceLocal:
		b.WriteString(`  <span class="seen" title="this server's host">this host</span>` + "\n")
	default:
		b.WriteString(`  <span class="seen" title="declared in the configuration">configured</span>` + "\n")
	}
	if v.Admin {
		// As the tiles' template writes them (machines.html).
		if m.State == arbiter.MachineDraining {
			b.WriteString(`  <button type="button" class="act admin" data-action="undrain" data-machine="` + name + `" data-title="Undrain ` + name +
				`" data-confirm="Place new allocations on ` + name + ` again?">Undrain</button>` + "\n")
		} else {
			b.WriteString(`  <button type="button" class="act admin" data-action="drain" data-machine="` + name + `" data-title="Drain ` + name +
				`" data-confirm="Stop placing new allocations on ` + name + `? What it holds stays until released.">Drain</button>` + "\n")
		}
	}
	b.WriteString("</article>")
	return template.HTML(b.String()) //nolint:gosec // every text is escaped
}

// cellHolder is what the cells of one allocation's GPUs say of their
// holder, written once per allocation.
type cellHolder struct {
	class string // " held o3"
	title string // " · held by alice · #12"
	ka    string // " · last keepalive 2025-… UTC", " · no keepalive"
	label string // "alice, #12"
}

func (v *view) cellHolder(a *arbiter.Allocation) *cellHolder {
	if h, ok := v.holders[a.ID]; ok {
		return h
	}
	if v.holders == nil {
		v.holders = map[int64]*cellHolder{}
	}
	owner, id := html.EscapeString(arbiter.ShortOwner(a.Owner)), strconv.FormatInt(a.ID, 10)
	h := &cellHolder{class: " held " + v.OwnerClass(a.Owner), title: " · held by " + owner + " · #" + id, label: owner + ", #" + id, ka: " · no keepalive"}
	if ka := lastKeepalive(a); ka != nil {
		h.ka = " · last keepalive " + abs(*ka)
	}
	v.holders[a.ID] = h
	return h
}

// writeCell writes one GPU's cell: its colour by class as a tile's (free,
// held in the owner's colour, releasing, unhealthy, drained, in use by an
// unmanaged process, idle), what a tile shows in its title, and a short
// accessible label.
func (v *view) writeCell(b *strings.Builder, machine string, d *arbiter.DeviceStatus, live map[int64]*arbiter.Allocation) {
	var h *cellHolder
	var idle bool
	if d.Allocation != nil {
		if a := live[*d.Allocation]; a != nil {
			h, idle = v.cellHolder(a), a.IdleSince != nil
		}
	}
	state := deviceState(d)
	idx := itoa(d.Index)
	b.WriteString(`<li id="g-`)
	b.WriteString(machine) // escaped by the caller
	b.WriteString(`-`)
	b.WriteString(idx)
	b.WriteString(`" class="cell`)
	if h != nil {
		b.WriteString(h.class)
	}
	if h == nil || state != arbiter.GPUHeld {
		b.WriteString(" " + state)
	}
	if d.Unmanaged {
		b.WriteString(" foreign")
	}
	if idle {
		b.WriteString(" idle")
	}
	// The title: as a tile's, then its holder.
	b.WriteString(`" title="GPU `)
	b.WriteString(idx)
	b.WriteString(` · `)
	b.WriteString(html.EscapeString(d.Model))
	b.WriteString(` · `)
	b.WriteString(gib(d.VRAMGiB))
	if d.Compute != "" {
		b.WriteString(` · compute `)
		b.WriteString(html.EscapeString(d.Compute))
	}
	if d.UUID != "" {
		b.WriteString(` · `)
		b.WriteString(html.EscapeString(d.UUID))
	}
	if state != arbiter.GPUFree && state != arbiter.GPUHeld {
		b.WriteString(` · ` + state)
		if d.StateReason != "" {
			b.WriteString(`: ` + html.EscapeString(d.StateReason))
		}
	}
	if h != nil {
		b.WriteString(h.title)
		if d.Since != nil {
			b.WriteString(` since `)
			b.WriteString(abs(*d.Since))
		}
		b.WriteString(h.ka)
		if idle {
			b.WriteString(` · idle`)
		}
	} else if state == arbiter.GPUFree {
		b.WriteString(` · free`)
	}
	if u := d.Usage; u != nil {
		use, _ := useText(u)
		b.WriteString(` · ` + html.EscapeString(use))
		for _, p := range u.Processes {
			b.WriteString(` · ` + html.EscapeString(procText(p)))
		}
	}
	if d.Unmanaged {
		b.WriteString(` · in use by a process no allocation accounts for`)
	}
	b.WriteString(`" aria-label="GPU `)
	b.WriteString(idx)
	b.WriteString(`: `)
	switch {
	case h != nil && state != arbiter.GPUHeld:
		b.WriteString(h.label)
		b.WriteString(", " + state)
	case h != nil:
		b.WriteString(h.label)
	default:
		b.WriteString(state)
	}
	if d.Unmanaged {
		b.WriteString(", unmanaged process")
	}
	b.WriteString(`"></li>`)
}
