package flamegraph

import (
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/offcpu/offcpu/internal/testenv"
)

// harness loads the SVG and the HTML page in frames, clicks a frame,
// searches, and writes what the DOM shows into #result.
const harness = `<!DOCTYPE html><html><body><pre id="result">pending</pre>
<iframe id="svg" src="/fg.svg" width="1200" height="400"></iframe>
<iframe id="html" src="/fg.html" width="1200" height="700"></iframe>
<script>
function check(id) {
  var f = document.getElementById(id), w = f.contentWindow, d = f.contentDocument, r = {};
  r.init = typeof w.fgZoom === "function" && w.fg_frames && w.fg_frames.length > 0;
  if (!r.init) { return r; }
  var target = null, outside = null, all = d.querySelectorAll("g.f");
  for (var i = 0; i < all.length; i++) {
    var t = all[i].querySelector("title").textContent;
    if (t.indexOf("dispatcher.(*Dispatcher).internalConsumerFlow (") === 0) { target = all[i]; }
    if (t.indexOf("ml-worker (") === 0) { outside = all[i]; }
  }
  r.widthBefore = parseFloat(target.querySelector("rect").getAttribute("width"));
  target.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  r.widthAfter = parseFloat(target.querySelector("rect").getAttribute("width"));
  r.outsideHidden = outside.classList.contains("hide");
  r.resetShown = !d.getElementById("unzoom").classList.contains("hide");
  w.fgReset();
  r.widthReset = parseFloat(target.querySelector("rect").getAttribute("width"));
  r.matchedPct = w.fgSearch("futex");
  r.matches = d.querySelectorAll("g.match").length;
  var m = d.querySelector("g.match rect");
  r.matchFill = m ? m.getAttribute("fill") : "";
  r.matchedText = d.getElementById("matched").textContent;
  r.table = !!d.getElementById("top");
  return r;
}
window.addEventListener("load", function () {
  var out = {};
  try { out.svg = check("svg"); out.html = check("html"); } catch (e) { out.error = String(e); }
  document.getElementById("result").textContent = JSON.stringify(out);
});
</script></body></html>`

func TestBrowser(t *testing.T) {
	bin := testenv.Chromium(t)
	dir := t.TempDir()
	p := load(t, "testdata/small.folded")
	os.WriteFile(filepath.Join(dir, "fg.svg"), render(t, p, Options{Title: "Off-CPU time"}), 0o644)
	os.WriteFile(filepath.Join(dir, "fg.html"), render(t, p, Options{Title: "Off-CPU time", HTML: true}), 0o644)
	os.WriteFile(filepath.Join(dir, "harness.html"), []byte(harness), 0o644)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()

	dom, logs := testenv.RunChromium(t, bin, "--virtual-time-budget=5000", "--dump-dom", srv.URL+"/harness.html")
	if regexp.MustCompile(`(?i)uncaught|SyntaxError|ReferenceError|TypeError`).MatchString(logs) {
		t.Errorf("script errors in the console:\n%s", logs)
	}
	m := regexp.MustCompile(`(?s)<pre id="result">(.*?)</pre>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no result in the DOM:\n%s", dom)
	}
	type res struct {
		Init                                bool
		WidthBefore, WidthAfter, WidthReset float64
		OutsideHidden, ResetShown, Table    bool
		MatchedPct                          float64
		Matches                             int
		MatchFill, MatchedText              string
	}
	var got struct {
		SVG, HTML *res
		Error     string
	}
	if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &got); err != nil || got.Error != "" {
		t.Fatalf("result %q: %v %s", m[1], err, got.Error)
	}
	for name, r := range map[string]*res{"svg": got.SVG, "html": got.HTML} {
		if r == nil || !r.Init {
			t.Errorf("%s: the script did not initialize", name)
			continue
		}
		if r.WidthAfter != 1180 || r.WidthBefore >= r.WidthAfter || r.WidthReset != r.WidthBefore {
			t.Errorf("%s: click to zoom: width %v → %v (want 1180), reset %v", name, r.WidthBefore, r.WidthAfter, r.WidthReset)
		}
		if !r.OutsideHidden || !r.ResetShown {
			t.Errorf("%s: zoom did not hide frames outside the clicked one or show Reset Zoom", name)
		}
		// futex_wait appears twice (3 ms and 2 ms of 10.4 ms): 48.1%.
		if r.Matches != 2 || r.MatchFill != "rgb(230,0,230)" || r.MatchedText != "Matched: 48.1%" {
			t.Errorf("%s: search: %d matches, fill %s, %q", name, r.Matches, r.MatchFill, r.MatchedText)
		}
	}
	if !got.HTML.Table {
		t.Error("html: no table of top functions")
	}

	art := os.Getenv("OFFCPU_ARTIFACTS")
	if art == "" {
		art = t.TempDir()
	}
	os.MkdirAll(art, 0o755)
	shot := filepath.Join(art, "flamegraph.png")
	testenv.RunChromium(t, bin, "--screenshot="+shot, "--window-size=1200,700", srv.URL+"/fg.html")
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Errorf("no screenshot written: %v", err)
	}
	t.Logf("screenshot: %s", shot)
}
