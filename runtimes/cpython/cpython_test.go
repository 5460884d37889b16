package cpython

import "testing"

func TestPyModule(t *testing.T) {
	for file, want := range map[string]string{
		"/usr/lib/python3.11/concurrent/futures/thread.py":                   "concurrent.futures.thread",
		"/usr/lib/python3.11/threading.py":                                   "threading",
		"/usr/lib/python3/dist-packages/gunicorn/arbiter.py":                 "gunicorn.arbiter",
		"/opt/venv/lib/python3.12/site-packages/flask/__init__.py":           "flask",
		"/root/.pyenv/versions/3.13.0/lib/python3.13/asyncio/base_events.py": "asyncio.base_events",
		"/srv/app/worker.py":            "worker",
		"<frozen importlib._bootstrap>": "importlib._bootstrap",
		"<string>":                      "<string>",
	} {
		if got := Module(file); got != want {
			t.Errorf("Module(%q) = %q, want %q", file, got, want)
		}
	}
}

// The 3.11+ location table (Objects/locations.md): a short-form entry,
// a one-line entry moving 2 lines on, a no-column entry moving back 1, a
// long-form entry, and one without a location.
func TestPyLine(t *testing.T) {
	table := []byte{
		0x80 | 0<<3 | 1, 5, // short form, 2 code units, line unchanged (10)
		0x80 | 12<<3, 1, 9, // one-line form, 1 unit, line +2 (12)
		0x80 | 13<<3 | 2, 3, // no column, 3 units, line -1 (svarint 3: -1) (11)
		0x80 | 14<<3, 8, 0, 1, 1, // long form, 1 unit, line +4 (svarint 8) (15)
		0x80 | 15<<3 | 1, // no location, 2 units
	}
	for idx, want := range map[uint64]int64{0: 10, 1: 10, 2: 12, 3: 11, 5: 11, 6: 15, 7: 0, 8: 0, 9: 0} {
		if got := Line(table, 10, idx); got != want {
			t.Errorf("instruction %d: line %d, want %d", idx, got, want)
		}
	}
}

func TestPyLineOld(t *testing.T) {
	// 3.10: (bytes, line delta) pairs; -128: no line.
	t310 := []byte{4, 0, 6, 2, 2, 0x80, 4, 0xff}
	for idx, want := range map[uint64]int64{0: 20, 1: 20, 2: 22, 4: 22, 5: 0, 6: 21, 9: 0} {
		if got := LineOld(t310, 20, idx, 310); got != want {
			t.Errorf("3.10, instruction %d: line %d, want %d", idx, got, want)
		}
	}
	// Up to 3.9: lnotab, f_lasti in bytes.
	lnotab := []byte{6, 1, 8, 2}
	for off, want := range map[uint64]int64{0: 5, 5: 5, 6: 6, 13: 6, 14: 8, 40: 8} {
		if got := LineOld(lnotab, 5, off, 38); got != want {
			t.Errorf("lnotab, byte %d: line %d, want %d", off, got, want)
		}
	}
}
