//go:build !(cgo && linux)

package gpu

import "context"

// detectNVML is unavailable without cgo on Linux: nvidia-smi is used instead.
func detectNVML(context.Context) (gpuInfo, error) { return gpuInfo{}, errNoNVML }

// openNVMLSampler is unavailable without cgo on Linux: nvidia-smi samples.
func openNVMLSampler() (nvmlSampler, error) { return nil, errNoNVML }
