package httpapi

import (
	_ "embed"
	"encoding/json"
)

// openAPI is the OpenAPI 3.1 description of the native API, written by
// hand next to the routes; a test checks that it names every route.
//
//go:embed openapi.json
var openAPI []byte

// openAPIDocument returns the document with info.version set to the
// server's version.
func openAPIDocument(version string) []byte {
	if version == "" {
		return openAPI
	}
	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		return openAPI // the test keeps it valid; serve it as it is
	}
	if info, ok := doc["info"].(map[string]any); ok {
		info["version"] = version
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return openAPI
	}
	return b
}
