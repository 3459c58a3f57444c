package grid

import "math"

// areaToRect chooses the rectangle of triads for a request of at least area
// triads in a free region of bw×bh triads, as the reference does (docs/reference/spalloc.md §4):
// the squarest exact factorisation; if its ratio (short/long) is below
// minRatio, a rectangle of at least that ratio with a little more area;
// turned upright when the region is wider than high; squeezed to the region
// if it does not fit, failing if the squeezed ratio is below minRatio.
//
// minRatio above 1 counts as its inverse. The float arithmetic follows the
// reference step by step so that the same inputs give the same rectangle.
func areaToRect(area, bw, bh int, minRatio float64) (w, h int, ok bool) {
	if area <= 0 || bw <= 0 || bh <= 0 || area > bw*bh {
		return 0, 0, false
	}
	if minRatio > 1 {
		minRatio = 1 / minRatio
	}
	w, h = squarestRectangle(area)
	if float64(h)/float64(w) < minRatio {
		w, h = rectangleWithRatio(area, minRatio)
	}
	if bw > bh && w > h {
		w, h = h, w
	}
	if w <= bw && h <= bh {
		return w, h, true
	}
	if w > bw {
		w = bw
		h = int(math.Ceil(float64(area) / float64(w)))
	} else {
		h = bh
		w = int(math.Ceil(float64(area) / float64(h)))
	}
	if float64(min(w, h))/float64(max(w, h)) >= minRatio {
		return w, h, true
	}
	return 0, 0, false
}

// squarestRectangle is the exact factorisation w×h = area with w ≥ h and h
// as large as possible.
func squarestRectangle(area int) (w, h int) {
	h = int(math.Sqrt(float64(area)))
	for ; h > 1; h-- {
		if area%h == 0 {
			break
		}
	}
	return area / h, h
}

// rectangleWithRatio is a landscape rectangle (w ≥ h) of at least area with
// h/w at least ratio (0 < ratio ≤ 1), not necessarily the squarest.
func rectangleWithRatio(area int, ratio float64) (w, h int) {
	fw := math.Sqrt(float64(area) / ratio)
	h = int(math.Ceil(float64(area) / fw))
	w = int(math.Ceil(float64(area) / float64(h)))
	return max(w, h), h
}
