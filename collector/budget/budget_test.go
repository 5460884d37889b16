package budget

import (
	"testing"
	"time"
)

func TestNextThreshold(t *testing.T) {
	thr := 100 * time.Microsecond
	for _, c := range []struct {
		name             string
		cost, walk       float64
		lower, higher    bool
		wantMin, wantMax time.Duration
	}{
		{name: "walks twice the room: doubled", cost: 0.015, walk: 0.01, wantMin: 2 * thr, wantMax: 2 * thr},
		{name: "under the budget: halved at most", cost: 0.002, walk: 0.001, wantMin: thr / 2, wantMax: thr / 2},
		{name: "base over the budget: up by 4", cost: 0.05, walk: 0.001, wantMin: 4 * thr, wantMax: 4 * thr},
		{name: "no walks: down", cost: 0.001, walk: 0, wantMin: thr / 2, wantMax: thr / 2},
	} {
		got := nextThreshold(thr, 0.01, c.cost, c.walk)
		if got < c.wantMin-c.wantMin/1000 || got > c.wantMax+c.wantMax/1000 {
			t.Errorf("%s: %v, want %v to %v", c.name, got, c.wantMin, c.wantMax)
		}
	}
	if got := nextThreshold(MaxWalkThreshold, 0.01, 0.5, 0.1); got != MaxWalkThreshold {
		t.Errorf("above the bound: %v", got)
	}
	if got := nextThreshold(minWalkThreshold, 0.01, 0, 0); got != minWalkThreshold {
		t.Errorf("below the bound: %v", got)
	}
}
