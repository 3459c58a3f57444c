// Package ui holds arbiter's dashboard: the html/template files and the
// static files (stylesheet, script, icon) the server embeds in the binary.
// It holds no logic: httpapi serves these files, renders the templates with
// the data of the running control plane and wires the routes (httpapi/ui.go).
//
// Templates live in templates/*.html. The page is "page" (the layout around
// the panels) or "login"; each panel is one block named "panel-<name>",
// rendered on its own so the page can refresh it after an event. Static files
// live in static/ and are served under /ui/static/.
package ui

import "embed"

// Templates holds templates/*.html, parsed by httpapi with its helper
// functions.
//
//go:embed templates/*.html
var Templates embed.FS

// Static holds static/*: served as they are, nothing fetched from elsewhere.
//
//go:embed static/*
var Static embed.FS
