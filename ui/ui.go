// Package ui is arbiter's dashboard: the html/template files and static
// files (stylesheet, script, icon) embedded in the binary, and their
// rendering from the committed state of the control plane. A Dashboard
// gives the API server (package httpapi) its routes, which the server
// mounts behind its authentication, roles and metrics; nothing here reads
// a token or writes to the control plane.
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
