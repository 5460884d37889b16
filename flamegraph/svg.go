package flamegraph

import (
	"bufio"
	"bytes"
	"fmt"
	"hash/fnv"
	"html"
	"io"
	"math"
	"strings"
)

// Options controls the rendering.
type Options struct {
	Title       string
	Subtitle    string
	Width       int     // pixels (default 1200)
	FrameHeight int     // pixels (default 16)
	MinWidth    float64 // frames narrower than this many pixels are merged (default 0.1)
	Inverted    bool    // icicle: roots at the top
	Palette     string  // offcpu (blue), wakeup, cpu (warm)
	Diff        bool    // colour by Node.Base: red grew, blue shrank
	// Negate (with Diff): the widths are the before profile and the base
	// is the after one, so frames that vanished keep their width and show
	// blue (difffolded.pl -n).
	Negate bool
	HTML   bool // an HTML page with the SVG and a table of top functions
}

const pad = 10

type writer struct {
	*bufio.Writer
	o        Options
	p        *Profile
	total    int64
	scale    float64 // pixels per unit
	maxDepth int
	height   int
	maxDelta float64
}

// rect is one frame to draw; depth 0 is the root.
type rect struct {
	name   []byte
	depth  int
	start  int64
	width  int64
	base   int64
	kernel bool
	merged int // frames merged into this one (narrow siblings)
}

// Write renders p.
func Write(w io.Writer, p *Profile, o Options) error {
	if o.Width <= 0 {
		o.Width = 1200
	}
	if o.FrameHeight <= 0 {
		o.FrameHeight = 16
	}
	if o.MinWidth <= 0 {
		o.MinWidth = 0.1
	}
	if o.Title == "" {
		o.Title = "Flame Graph"
	}
	o.Diff = o.Diff || p.diff
	wr := &writer{Writer: bufio.NewWriterSize(w, 1<<16), o: o, p: p}
	lines := p.sorted()
	var baseTotal int64
	for _, l := range lines {
		wr.total += l.Value
		baseTotal += l.Base
	}
	if wr.total > 0 {
		wr.scale = float64(o.Width-2*pad) / float64(wr.total)
	}
	rects := wr.layout(lines)
	rects = append(rects, rect{name: []byte("all"), start: 0, width: wr.total, base: baseTotal})
	for _, r := range rects {
		wr.maxDepth = max(wr.maxDepth, r.depth)
		if o.Diff {
			wr.maxDelta = math.Max(wr.maxDelta, math.Abs(float64(r.width-r.base)))
		}
	}
	wr.height = (wr.maxDepth+1)*o.FrameHeight + 80
	if o.HTML {
		fmt.Fprintf(wr, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n<style>body{font-family:Verdana,sans-serif;margin:8px} table{border-collapse:collapse;font-size:13px} td,th{padding:2px 8px;text-align:left} td.v{text-align:right}</style></head><body>\n", html.EscapeString(o.Title))
	} else {
		wr.WriteString("<?xml version=\"1.0\" standalone=\"no\"?>\n")
	}
	fmt.Fprintf(wr, `<svg version="1.1" id="flamegraph" width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">`+"\n",
		o.Width, wr.height, o.Width, wr.height)
	wr.WriteString(style)
	fmt.Fprintf(wr, "<script type=\"text/ecmascript\"><![CDATA[\nvar fg_width=%d, fg_pad=%d, fg_inverted=%v;\n%s]]></script>\n", o.Width, pad, o.Inverted, script)
	fmt.Fprintf(wr, `<rect x="0" y="0" width="100%%" height="100%%" fill="%s"/>`+"\n", background(o))
	fmt.Fprintf(wr, `<text id="title" x="%d" y="24">%s</text>`+"\n", o.Width/2, html.EscapeString(o.Title))
	if o.Subtitle != "" {
		fmt.Fprintf(wr, `<text id="subtitle" x="%d" y="42">%s</text>`+"\n", o.Width/2, html.EscapeString(o.Subtitle))
	}
	fmt.Fprintf(wr, `<text id="details" x="%d" y="%d"> </text>`+"\n", pad, wr.height-17)
	fmt.Fprintf(wr, `<text id="unzoom" class="hide" x="%d" y="24">Reset Zoom</text>`+"\n", pad)
	fmt.Fprintf(wr, `<text id="search" x="%d" y="24">Search</text>`+"\n", o.Width-110)
	fmt.Fprintf(wr, `<text id="matched" x="%d" y="%d"> </text>`+"\n", o.Width-110, wr.height-17)
	wr.WriteString("<g id=\"frames\">\n")
	for i := len(rects) - 1; i >= 0; i-- { // root first
		wr.rect(&rects[i])
	}
	wr.WriteString("</g>\n</svg>\n")
	if o.HTML {
		wr.topTable()
		wr.WriteString("</body></html>\n")
	}
	return wr.Flush()
}

type openFrame struct {
	name   []byte
	start  int64
	base   int64
	kernel bool
}

type pendingFrame struct {
	openFrame
	active bool
	end    int64
	n      int
}

// layout walks the sorted stacks once and returns the frames at least
// MinWidth wide; contiguous narrower siblings are merged into one frame,
// drawn when it is a pixel wide or more.
func (w *writer) layout(lines []Line) []rect {
	l := &layouter{w: w, deepest: -1}
	var prev, cur [][]byte
	for _, line := range lines {
		cur = splitFrames(cur[:0], line.Stack)
		common := 0
		for common < len(prev) && common < len(cur) && bytes.Equal(prev[common], cur[common]) {
			common++
		}
		l.closeFrom(common)
		// "-" switches between user and kernel frames; after "--" come
		// the waker's kernel frames. Separators are neither.
		kernel := false
		for d, f := range cur {
			sep := string(f) == "-" || string(f) == "--"
			if d >= common {
				l.open = append(l.open, openFrame{name: f, start: l.x, kernel: kernel && !sep})
			}
			switch string(f) {
			case "-":
				kernel = !kernel
			case "--":
				kernel = true
			}
		}
		for d := range l.open {
			l.open[d].base += line.Base
		}
		l.x += line.Value
		prev, cur = cur, prev
	}
	l.closeFrom(0)
	for d := range l.pending {
		l.flush(d)
	}
	return l.out
}

// splitFrames appends a folded stack's frames to cur.
func splitFrames(cur [][]byte, s []byte) [][]byte {
	for {
		i := bytes.IndexByte(s, ';')
		if i < 0 {
			return append(cur, s)
		}
		cur = append(cur, s[:i])
		s = s[i+1:]
	}
}

// layouter places frames left to right: the frames of the current stack
// stay open until a stack leaves them; contiguous narrow siblings wait as
// pending frames to be merged.
type layouter struct {
	w       *writer
	out     []rect
	open    []openFrame
	pending []pendingFrame
	x       int64
	deepest int // deepest depth with an active pending frame
}

func (l *layouter) narrow(width int64) bool { return float64(width)*l.w.scale < l.w.o.MinWidth }

func (l *layouter) flush(d int) {
	if d >= len(l.pending) || !l.pending[d].active {
		return
	}
	p := &l.pending[d]
	p.active = false
	// A group of merged narrow frames is drawn from a pixel wide: under
	// that it cannot be hovered or seen, and such groups were half the
	// frames of a large graph.
	width := p.end - p.start
	if p.n > 1 && float64(width)*l.w.scale < max(1, l.w.o.MinWidth) {
		return
	}
	if !l.narrow(width) {
		l.out = append(l.out, rect{name: p.name, depth: d + 1, start: p.start, width: width, base: p.base, kernel: p.kernel, merged: p.n})
	}
}

// closeFrom closes the open frames from depth d up.
func (l *layouter) closeFrom(d int) {
	for i := len(l.open) - 1; i >= d; i-- {
		// Pending frames below this one belong to it: flush them.
		for ; l.deepest > i; l.deepest-- {
			l.flush(l.deepest)
		}
		f := l.open[i]
		width := l.x - f.start
		if !l.narrow(width) {
			l.flush(i)
			l.out = append(l.out, rect{name: f.name, depth: i + 1, start: f.start, width: width, base: f.base, kernel: f.kernel, merged: 1})
			continue
		}
		for len(l.pending) <= i {
			l.pending = append(l.pending, pendingFrame{})
		}
		p := &l.pending[i]
		if p.active && p.end == f.start {
			p.end, p.base, p.n = l.x, p.base+f.base, p.n+1
		} else {
			l.flush(i)
			*p = pendingFrame{openFrame: f, active: true, end: l.x, n: 1}
			l.deepest = max(l.deepest, i)
		}
	}
	l.open = l.open[:d]
}

func (w *writer) y(depth int) int {
	if w.o.Inverted {
		return 50 + depth*w.o.FrameHeight
	}
	return w.height - 50 - (depth+1)*w.o.FrameHeight
}

func (w *writer) rect(r *rect) {
	name := string(r.name)
	if r.merged > 1 {
		name = fmt.Sprintf("[%d narrow frames]", r.merged)
	}
	px := float64(pad) + float64(r.start)*w.scale
	pw := float64(r.width) * w.scale
	y := w.y(r.depth)
	fill := w.color(name, r)
	info := fmt.Sprintf("%s (%s, %.2f%%)", name, w.value(r.width), 100*float64(r.width)/float64(max(w.total, 1)))
	if w.o.Diff && w.o.Negate {
		info += fmt.Sprintf(", after %s, change %s", w.value(r.base), signedValue(w, r.base-r.width))
	} else if w.o.Diff {
		info += fmt.Sprintf(", base %s, change %s", w.value(r.base), signedValue(w, r.width-r.base))
	}
	fmt.Fprintf(w, `<g class="f"><title>%s</title><rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" rx="2" ry="2"/>`,
		html.EscapeString(info), px, y, pw, w.o.FrameHeight-1, fill)
	if label := fit(name, pw); label != "" {
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`, px+3, y+w.o.FrameHeight-5, html.EscapeString(label))
	}
	w.WriteString("</g>\n")
}

// fit truncates a label to the width of its frame (about 7 px a char).
func fit(name string, px float64) string {
	chars := int((px - 6) / 7)
	if chars < 3 {
		return ""
	}
	if len(name) <= chars {
		return name
	}
	return name[:chars-2] + ".."
}

func (w *writer) value(v int64) string {
	switch w.p.Unit {
	case "ns":
		return fmt.Sprintf("%.3f ms", float64(v)/1e6)
	case "us":
		return fmt.Sprintf("%.3f ms", float64(v)/1e3)
	}
	return fmt.Sprintf("%d", v)
}

func signedValue(w *writer, d int64) string {
	if d >= 0 {
		return "+" + w.value(d)
	}
	return "-" + w.value(-d)
}

func hash(name string) float64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return float64(h.Sum32()%1000) / 1000
}

func (w *writer) color(name string, r *rect) string {
	switch {
	case name == "-":
		return "rgb(170,170,170)"
	case name == "--":
		return "rgb(70,70,70)"
	case r.merged > 1:
		return "rgb(220,220,220)"
	case r.depth == 0:
		return "rgb(230,230,230)"
	}
	if w.o.Diff {
		d := float64(r.width - r.base)
		if w.o.Negate {
			d = -d
		}
		if w.maxDelta == 0 || d == 0 {
			return "rgb(250,250,250)"
		}
		c := int(210 * (1 - math.Abs(d)/w.maxDelta))
		if d > 0 {
			return fmt.Sprintf("rgb(255,%d,%d)", c, c)
		}
		return fmt.Sprintf("rgb(%d,%d,255)", c, c)
	}
	v := hash(name)
	switch w.o.Palette {
	case "cpu":
		if r.kernel {
			return fmt.Sprintf("rgb(%d,%d,%d)", 200+int(55*v), 120+int(60*v), 40)
		}
		return fmt.Sprintf("rgb(%d,%d,%d)", 205+int(50*v), int(230*v), int(55*v))
	case "wakeup":
		if r.kernel {
			return fmt.Sprintf("rgb(%d,%d,%d)", 180+int(40*v), 160+int(40*v), 230)
		}
		return fmt.Sprintf("rgb(%d,%d,%d)", 150+int(50*v), 90+int(40*v), 210+int(45*v))
	}
	if r.kernel {
		return fmt.Sprintf("rgb(%d,%d,%d)", 60+int(40*v), 160+int(50*v), 170+int(40*v))
	}
	return fmt.Sprintf("rgb(%d,%d,%d)", 80+int(60*v), 80+int(60*v), 190+int(55*v))
}

func background(o Options) string {
	switch {
	case o.Diff:
		return "rgb(250,250,250)"
	case o.Palette == "cpu":
		return "rgb(250,245,235)"
	}
	return "rgb(242,244,250)"
}

func (w *writer) topTable() {
	fmt.Fprintf(w, "<h2>Top functions (self)</h2>\n<table id=\"top\"><tr><th>function</th><th>self</th><th>share</th></tr>\n")
	for _, c := range w.p.TopFunctions(30) {
		fmt.Fprintf(w, "<tr><td>%s</td><td class=\"v\">%s</td><td class=\"v\">%.2f%%</td></tr>\n",
			html.EscapeString(c.Name), w.value(c.Value), 100*float64(c.Value)/float64(max(w.total, 1)))
	}
	fmt.Fprintf(w, "</table>\n")
}

const style = `<style type="text/css">
text{font-family:Verdana,sans-serif;font-size:12px;fill:rgb(0,0,0)}
#title{text-anchor:middle;font-size:17px} #subtitle{text-anchor:middle;fill:rgb(90,90,90)}
#search,#unzoom{cursor:pointer} .hide{display:none}
g.f:hover rect{stroke:black;stroke-width:0.5} g.f{cursor:pointer}
</style>
`

// script: zoom on click, reset, search with the matched share; hooks for
// tests as window.fgZoom, window.fgReset and window.fgSearch.
var script = strings.TrimSpace(`
var fg_frames, fg_details, fg_unzoom, fg_matched, fg_search, fg_svg;
function fg_init() {
  fg_svg = document.getElementById("flamegraph");
  fg_frames = fg_svg.querySelectorAll("g.f");
  fg_details = document.getElementById("details").firstChild;
  fg_unzoom = document.getElementById("unzoom");
  fg_matched = document.getElementById("matched");
  fg_search = document.getElementById("search");
  for (var i = 0; i < fg_frames.length; i++) {
    var r = fg_frames[i].querySelector("rect");
    r.setAttribute("data-x", r.getAttribute("x"));
    r.setAttribute("data-w", r.getAttribute("width"));
    r.setAttribute("data-fill", r.getAttribute("fill"));
    fg_frames[i].addEventListener("click", function (e) { fgZoom(this); });
    fg_frames[i].addEventListener("mouseover", function (e) { fg_details.nodeValue = "Function: " + this.querySelector("title").textContent; });
    fg_frames[i].addEventListener("mouseout", function (e) { fg_details.nodeValue = " "; });
  }
  fg_unzoom.addEventListener("click", function () { fgReset(); });
  fg_search.addEventListener("click", function () {
    var term = prompt("Enter a search term (regexp allowed)", "");
    if (term) { fgSearch(term); } else { fgSearch(null); }
  });
}
function fg_name(g) { var t = g.querySelector("title").textContent; return t.substring(0, t.lastIndexOf(" (")); }
function fg_label(g, w) {
  var t = g.querySelector("text"), name = fg_name(g), chars = Math.floor((w - 6) / 7);
  if (!t) { return; }
  t.textContent = chars < 3 ? "" : (name.length <= chars ? name : name.substring(0, chars - 2) + "..");
}
function fgZoom(g) {
  var r = g.querySelector("rect");
  var x0 = parseFloat(r.getAttribute("data-x")), w0 = parseFloat(r.getAttribute("data-w"));
  var y0 = parseFloat(r.getAttribute("y"));
  var scale = (fg_width - 2 * fg_pad) / w0;
  fg_unzoom.classList.remove("hide");
  for (var i = 0; i < fg_frames.length; i++) {
    var f = fg_frames[i], fr = f.querySelector("rect");
    var x = parseFloat(fr.getAttribute("data-x")), w = parseFloat(fr.getAttribute("data-w")), y = parseFloat(fr.getAttribute("y"));
    var below = fg_inverted ? y <= y0 : y >= y0;
    if (x + w <= x0 + 0.01 || x >= x0 + w0 - 0.01) {
      f.classList.add("hide");
    } else if (below && y != y0) {
      f.classList.remove("hide");
      fr.setAttribute("x", fg_pad); fr.setAttribute("width", fg_width - 2 * fg_pad);
      fg_label(f, fg_width - 2 * fg_pad);
    } else {
      f.classList.remove("hide");
      var nx = (x - x0) * scale + fg_pad, nw = w * scale;
      fr.setAttribute("x", nx.toFixed(1)); fr.setAttribute("width", nw.toFixed(1));
      var t = f.querySelector("text"); if (t) { t.setAttribute("x", (nx + 3).toFixed(1)); }
      fg_label(f, nw);
    }
  }
}
function fgReset() {
  fg_unzoom.classList.add("hide");
  for (var i = 0; i < fg_frames.length; i++) {
    var f = fg_frames[i], fr = f.querySelector("rect");
    f.classList.remove("hide");
    fr.setAttribute("x", fr.getAttribute("data-x")); fr.setAttribute("width", fr.getAttribute("data-w"));
    var t = f.querySelector("text"); if (t) { t.setAttribute("x", (parseFloat(fr.getAttribute("data-x")) + 3).toFixed(1)); }
    fg_label(f, parseFloat(fr.getAttribute("data-w")));
  }
}
function fgSearch(term) {
  var re = term ? new RegExp(term) : null, spans = [], total = 0;
  for (var i = 0; i < fg_frames.length; i++) {
    var f = fg_frames[i], fr = f.querySelector("rect");
    if (re && re.test(fg_name(f))) {
      fr.setAttribute("fill", "rgb(230,0,230)");
      f.classList.add("match");
      spans.push([parseFloat(fr.getAttribute("data-x")), parseFloat(fr.getAttribute("data-w"))]);
    } else {
      fr.setAttribute("fill", fr.getAttribute("data-fill"));
      f.classList.remove("match");
    }
  }
  // Matched share: the union of matched spans, so nested matches count once.
  spans.sort(function (a, b) { return a[0] - b[0]; });
  var end = -1;
  for (var j = 0; j < spans.length; j++) {
    var s = spans[j][0], e = s + spans[j][1];
    if (s >= end) { total += e - s; end = e; } else if (e > end) { total += e - end; end = e; }
  }
  var pct = 100 * total / (fg_width - 2 * fg_pad);
  fg_matched.textContent = re ? "Matched: " + pct.toFixed(1) + "%" : " ";
  fg_search.textContent = re ? "Reset Search" : "Search";
  return pct;
}
if (document.readyState === "loading") { window.addEventListener("DOMContentLoaded", fg_init); } else { fg_init(); }
`) + "\n"
