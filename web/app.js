// lightswitch's web view: a timeline of sample density per host → process →
// thread (GET v1/timeline, drawn with uPlot and canvas strips), and the flame
// graph of a selected range (GET v1/profiles/merged?format=svg, inferno's SVG
// with click-to-zoom and search) or the differential flame graph of two
// ranges (GET v1/profiles/diff). Times are ns since the Unix epoch, held as
// BigInt; the view's state lives in the URL fragment so a link reloads it.
'use strict';

const MIN_SPAN = 1_000_000n; // 1 ms: single samples at 10 kHz are 100 µs apart
const MAX_SPAN = 366n * 86_400n * 1_000_000_000n;
const TOP_PROCESSES = 25;
const TOP_THREADS = 12;
const COLORS = ['#2864e6', '#d9480f', '#2b8a3e', '#862e9c', '#c92a2a', '#0b7285'];

const $ = (id) => document.getElementById(id);
const state = { from: 0n, to: 0n, sel: null, base: null, host: '', pid: '', tid: '', comm: '' };
let expanded = new Set(); // "host/pid" of processes whose threads are shown
let plot = null;
let lastData = null;
let timelineSeq = 0;
let flameSeq = 0;
let flameUrl = null;

// ---- time -----------------------------------------------------------------

const nowNs = () => BigInt(Date.now()) * 1_000_000n;
const minBig = (a, b) => (a < b ? a : b);
const maxBig = (a, b) => (a > b ? a : b);

/** `ns` as a UTC time, with `digits` decimals of the second (0-9). */
function fmtTime(ns, digits) {
  const ms = ns / 1_000_000n;
  const iso = new Date(Number(ms)).toISOString(); // 2026-12-04T14:00:25.123Z
  const frac = (ns % 1_000_000_000n).toString().padStart(9, '0').slice(0, digits);
  return iso.slice(0, 10) + ' ' + iso.slice(11, 19) + (digits > 0 ? '.' + frac : '');
}

/** Decimals that tell apart times `span` ns apart. */
function digitsFor(span) {
  let digits = 0;
  let unit = 1_000_000_000n;
  while (digits < 9 && span < unit * 20n) {
    digits += 1;
    unit /= 10n;
  }
  return digits;
}

/** A tick label: the date and minute over days, the time within a day,
 * the second and its fraction below a few seconds. */
function axisLabel(ns, digits) {
  const text = fmtTime(ns, digits);
  if (state.to - state.from >= 2n * 86_400n * 1_000_000_000n) return text.slice(5, 16);
  return text.slice(digits > 3 ? 17 : 11);
}

/** A duration in words: 1.5 s, 300 µs. */
function fmtSpan(ns) {
  const n = Number(ns);
  const units = [[86400e9, 'd'], [3600e9, 'h'], [60e9, 'min'], [1e9, 's'], [1e6, 'ms'], [1e3, 'µs'], [1, 'ns']];
  for (const [size, name] of units) {
    if (n >= size) return `${+(n / size).toPrecision(3)} ${name}`;
  }
  return '0 ns';
}

/** The smallest 1-2-5 multiple of 1 µs at least `ns`. */
function niceStep(ns) {
  let step = 1000n;
  for (;;) {
    for (const m of [1n, 2n, 5n]) {
      if (step * m >= ns) return step * m;
    }
    step *= 10n;
  }
}

// ---- URL state ------------------------------------------------------------

function parseRange(text) {
  const m = /^(\d+)-(\d+)$/.exec(text || '');
  if (!m) return null;
  const a = BigInt(m[1]);
  const b = BigInt(m[2]);
  return a < b ? [a, b] : null;
}

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const to = /^\d+$/.test(p.get('to') || '') ? BigInt(p.get('to')) : nowNs();
  const from = /^\d+$/.test(p.get('from') || '') ? BigInt(p.get('from')) : to - 900n * 1_000_000_000n;
  state.from = from < to ? from : to - 900n * 1_000_000_000n;
  state.to = to;
  state.sel = parseRange(p.get('sel'));
  state.base = state.sel ? parseRange(p.get('base')) : null;
  for (const k of ['host', 'pid', 'tid', 'comm']) state[k] = p.get(k) || '';
  $('comm').value = state.comm;
}

function writeHash() {
  const p = new URLSearchParams();
  p.set('from', state.from.toString());
  p.set('to', state.to.toString());
  if (state.sel) p.set('sel', `${state.sel[0]}-${state.sel[1]}`);
  if (state.base) p.set('base', `${state.base[0]}-${state.base[1]}`);
  for (const k of ['host', 'pid', 'tid', 'comm']) if (state[k]) p.set(k, state[k]);
  history.replaceState(null, '', '#' + p.toString());
}

/** The filters as query parameters (`&host=…&pid=…`). */
function filterQuery() {
  let q = '';
  for (const k of ['host', 'pid', 'tid', 'comm']) {
    if (state[k]) q += `&${k}=${encodeURIComponent(state[k])}`;
  }
  return q;
}

// ---- timeline -------------------------------------------------------------

function plotWidth() {
  return Math.max(300, $('timeline').clientWidth - 20);
}

const GUTTER = 220; // px left of the plot: the y axis, and the rows' labels

async function loadTimeline() {
  const seq = ++timelineSeq;
  document.body.dataset.timeline = 'loading';
  const span = state.to - state.from;
  const buckets = BigInt(Math.max(100, plotWidth() - GUTTER));
  let step = niceStep((span + buckets - 1n) / buckets);
  for (let attempt = 0; attempt < 40; attempt += 1) {
    const url = `v1/timeline?from=${state.from}&to=${state.to}&step=${step}`;
    let response;
    try {
      response = await fetch(url);
    } catch (e) {
      return timelineError(seq, `${url}: ${e}`);
    }
    if (seq !== timelineSeq) return;
    if (response.status === 413) {
      step = niceStep(step * 2n + 1n); // too many buckets or samples for this step
      continue;
    }
    if (!response.ok) return timelineError(seq, `${response.status} ${await response.text()}`);
    const data = await response.json();
    if (seq !== timelineSeq) return;
    lastData = data;
    $('status').textContent = '';
    render(data);
    document.body.dataset.timeline = 'loaded';
    return;
  }
  timelineError(seq, 'the server refused every step tried (413)');
}

function timelineError(seq, message) {
  if (seq !== timelineSeq) return;
  $('status').textContent = `timeline: ${message}`;
  document.body.dataset.timeline = 'error';
}

/** Dense counts of a sparse [[index, count], ...] list. */
function dense(counts, n) {
  const out = new Array(n).fill(0);
  for (const [i, c] of counts) if (i >= 0 && i < n) out[i] = c;
  return out;
}

function render(data) {
  const n = data.buckets;
  const from = BigInt(data.from);
  const step = Number(BigInt(data.step)) / 1e9;
  const xs = Array.from({ length: n }, (_, i) => i * step);
  const series = [{ label: 'time (UTC)', value: (u, v) => (v == null ? '' : fmtTime(from + BigInt(Math.round(v * 1e9)), 6)) }];
  const values = [xs];
  data.hosts.forEach((h, k) => {
    const color = COLORS[k % COLORS.length];
    series.push({
      label: h.host,
      stroke: color,
      fill: color + '33',
      paths: uPlot.paths.stepped({ align: 1 }),
      value: (u, v) => (v == null ? '' : `${v} samples`),
    });
    values.push(dense(h.counts, n));
  });
  const span = Number(state.to - state.from) / 1e9;
  const digits = digitsFor(state.to - state.from);
  const opts = {
    width: plotWidth(),
    height: 200,
    scales: { x: { time: false, range: () => [0, span] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
    axes: [
      { space: 130, values: (u, splits) => splits.map((s) => axisLabel(state.from + BigInt(Math.round(s * 1e9)), digits)) },
      { size: GUTTER, label: `samples / ${fmtSpan(BigInt(data.step))}`, labelSize: 20 },
    ],
    series,
    cursor: { drag: { x: true, y: false, setScale: false } },
    legend: { show: true },
    hooks: { setSelect: [onSelect], draw: [drawOverlays] },
  };
  if (plot) plot.destroy();
  plot = new uPlot(opts, values, $('chart'));
  const over = plot.root.querySelector('.u-over');
  over.addEventListener('mousedown', (e) => { plot._shift = e.shiftKey; }, true);
  over.addEventListener('wheel', onWheel, { passive: false });
  over.addEventListener('dblclick', () => zoomBy(2));
  renderRows(data);
  $('range').textContent = `${fmtTime(state.from, digits)} – ${fmtTime(state.to, digits).slice(11)} UTC (${fmtSpan(state.to - state.from)})`;
  drawOverlays();
}

/** The rows under the chart: host, then its busiest processes and threads. */
function renderRows(data) {
  const rows = $('rows');
  rows.textContent = '';
  const width = Math.round(plot.bbox.width / devicePixelRatio);
  const left = Math.round(plot.bbox.left / devicePixelRatio);
  for (const h of data.hosts) {
    addRow(rows, 'host', h.host, `${h.total} samples`, h, { host: h.host }, left, width, data.buckets);
    const processes = h.processes.slice().sort((a, b) => b.total - a.total);
    processes.slice(0, TOP_PROCESSES).forEach((p, k) => {
      const key = `${h.host}/${p.pid}`;
      if (k < 3 && !expanded.has('!' + key)) expanded.add(key);
      const open = expanded.has(key);
      const row = addRow(rows, 'process', `${p.comm} (${p.pid})`, `${p.total} samples`, p,
        { host: h.host, pid: String(p.pid) }, left, width, data.buckets, open ? '▾' : '▸');
      row.querySelector('.toggle').addEventListener('click', (e) => {
        e.stopPropagation();
        if (open) { expanded.delete(key); expanded.add('!' + key); } else { expanded.add(key); expanded.delete('!' + key); }
        renderRows(lastData);
        drawOverlays();
      });
      if (!open) return;
      const threads = p.threads.slice().sort((a, b) => b.total - a.total);
      for (const t of threads.slice(0, TOP_THREADS)) {
        addRow(rows, 'thread', `${t.name} (${t.tid})`, `${t.total} samples`, t,
          { host: h.host, pid: String(p.pid), tid: String(t.tid) }, left, width, data.buckets);
      }
      if (threads.length > TOP_THREADS) moreRow(rows, 'thread', threads.length - TOP_THREADS, 'threads', left);
    });
    if (processes.length > TOP_PROCESSES) moreRow(rows, 'process', processes.length - TOP_PROCESSES, 'processes', left);
  }
  if (!data.hosts.length) {
    const empty = document.createElement('div');
    empty.className = 'status';
    empty.textContent = 'no samples in this range';
    rows.appendChild(empty);
  }
}

function addRow(rows, kind, name, tip, item, filter, left, width, buckets, toggle) {
  const row = document.createElement('div');
  row.className = `row ${kind}`;
  row.dataset.kind = kind;
  const active = ['host', 'pid', 'tid'].every((k) => (filter[k] || '') === state[k]);
  if (active) row.classList.add('active');
  const label = document.createElement('span');
  label.className = 'label';
  label.style.width = `${left}px`;
  label.title = `${name}: ${tip} (click: flame graph of only these)`;
  if (toggle) {
    const t = document.createElement('span');
    t.className = 'toggle';
    t.textContent = toggle;
    label.appendChild(t);
  }
  label.appendChild(document.createTextNode(name));
  const canvas = document.createElement('canvas');
  canvas.width = Math.round(width * devicePixelRatio);
  canvas.height = Math.round(16 * devicePixelRatio);
  canvas.style.width = `${width}px`;
  row.append(label, canvas);
  drawStrip(canvas, item.counts, buckets, kind);
  row.addEventListener('click', () => {
    const same = ['host', 'pid', 'tid'].every((k) => (filter[k] || '') === state[k]);
    for (const k of ['host', 'pid', 'tid']) state[k] = same ? '' : filter[k] || '';
    writeHash();
    renderRows(lastData);
    renderFilters();
    loadFlame();
  });
  rows.appendChild(row);
  return row;
}

function moreRow(rows, kind, n, what, left) {
  const row = document.createElement('div');
  row.className = `row ${kind} more`;
  row.innerHTML = `<span class="label" style="width:${left}px">… ${n} more ${what}</span>`;
  rows.appendChild(row);
}

/** Bars of `counts` over `buckets`, each as high as its count over the row's largest. */
function drawStrip(canvas, counts, buckets, kind) {
  const ctx = canvas.getContext('2d');
  const w = canvas.width;
  const h = canvas.height;
  let max = 1;
  for (const [, c] of counts) max = Math.max(max, c);
  ctx.fillStyle = kind === 'host' ? '#2864e6' : kind === 'process' ? '#3b8fd9' : '#6aa7e0';
  const bw = w / buckets;
  for (const [i, c] of counts) {
    const bh = Math.max(1, Math.round((h * c) / max));
    ctx.fillRect(Math.floor(i * bw), h - bh, Math.max(1, Math.ceil(bw)), bh);
  }
}

// ---- selection, zoom ------------------------------------------------------

/** The time at `x` px into the plot. */
function timeAt(x) {
  const v = plot.posToVal(x, 'x');
  const t = state.from + BigInt(Math.round(v * 1e9));
  return minBig(maxBig(t, state.from), state.to);
}

function onSelect(u) {
  if (u.select.width < 2) return;
  const range = [timeAt(u.select.left), timeAt(u.select.left + u.select.width)];
  u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
  if (range[1] <= range[0]) return;
  if (u._shift && state.sel) state.base = range;
  else { state.sel = range; }
  writeHash();
  drawOverlays();
  loadFlame();
}

/** Where time `t` is, px from the left of #timeline (may be off the plot). */
function xOf(t) {
  const v = Number(t - state.from) / 1e9;
  const over = plot.root.querySelector('.u-over');
  const box = over.getBoundingClientRect();
  const outer = $('timeline').getBoundingClientRect();
  return box.left - outer.left + $('timeline').scrollLeft + plot.valToPos(v, 'x');
}

function drawOverlays() {
  const layer = $('overlays');
  layer.textContent = '';
  if (!plot) return;
  const over = plot.root.querySelector('.u-over').getBoundingClientRect();
  const outer = $('timeline').getBoundingClientRect();
  const lo = over.left - outer.left;
  const hi = lo + over.width;
  for (const [name, range] of [['base', state.base], ['sel', state.sel]]) {
    if (!range) continue;
    const a = Math.max(lo, xOf(range[0]));
    const b = Math.min(hi, xOf(range[1]));
    if (b < lo || a > hi) continue;
    const div = document.createElement('div');
    div.className = `overlay ${name}`;
    div.style.left = `${a}px`;
    div.style.width = `${Math.max(1, b - a)}px`;
    layer.appendChild(div);
  }
}

/** Show [from, to), clamped to sensible spans, and reload the timeline. */
function setView(from, to) {
  let span = to - from;
  if (span < MIN_SPAN) { const mid = from + span / 2n; span = MIN_SPAN; from = mid - span / 2n; }
  if (span > MAX_SPAN) { from = to - MAX_SPAN; }
  state.from = maxBig(0n, from);
  state.to = state.from + maxBig(MIN_SPAN, minBig(span, MAX_SPAN));
  writeHash();
  loadTimeline();
}

/** Zoom by `factor` (2: out, 0.5: in) around time `center`. */
function zoomBy(factor, center) {
  const c = center ?? (state.from + state.to) / 2n;
  const scale = (d) => BigInt(Math.round(Number(d) * factor));
  setView(c - scale(c - state.from), c + scale(state.to - c));
}

let wheelTimer = null;
function onWheel(e) {
  e.preventDefault();
  const center = timeAt(e.offsetX);
  clearTimeout(wheelTimer);
  wheelTimer = setTimeout(() => zoomBy(e.deltaY > 0 ? 2 : 0.5, center), 60);
}

// ---- flame graph ----------------------------------------------------------

function mergedUrl(format) {
  return `v1/profiles/merged?from=${state.sel[0]}&to=${state.sel[1]}&format=${format}${filterQuery()}`;
}

async function loadFlame() {
  const seq = ++flameSeq;
  renderSelection();
  const frame = $('flame-frame');
  if (!state.sel) {
    frame.removeAttribute('src');
    document.body.dataset.flame = 'none';
    return;
  }
  document.body.dataset.flame = 'loading';
  const url = state.base
    ? `v1/profiles/diff?from=${state.sel[0]}&to=${state.sel[1]}&base_from=${state.base[0]}&base_to=${state.base[1]}&format=svg${filterQuery()}`
    : mergedUrl('svg');
  $('flame-status').textContent = 'loading…';
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    return flameError(seq, `${e}`);
  }
  if (seq !== flameSeq) return;
  if (!response.ok) return flameError(seq, `${response.status}: ${await response.text()}`);
  const svg = await response.blob();
  if (seq !== flameSeq) return;
  const samples = response.headers.get('x-lightswitch-samples');
  // Off-CPU waits in the range (an --off-cpu agent's): their flame graph too.
  const waits = Number(response.headers.get('x-lightswitch-off-cpu-waits') ?? 0);
  $('dl-svg-off-cpu').hidden = !!state.base || !(waits > 0);
  $('dl-svg-off-cpu').href = mergedUrl('flame-graph-off-cpu');
  $('flame-status').textContent = '';
  $('flame-status').dataset.samples = samples ?? '';
  if (flameUrl) URL.revokeObjectURL(flameUrl);
  flameUrl = URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' }));
  frame.onload = () => { if (seq === flameSeq) document.body.dataset.flame = state.base ? 'diff' : 'loaded'; };
  frame.src = flameUrl;
  $('dl-svg').href = url;
}

function flameError(seq, message) {
  if (seq !== flameSeq) return;
  $('flame-frame').removeAttribute('src');
  $('flame-status').textContent = `flame graph: ${message}`;
  document.body.dataset.flame = 'error';
}

function renderSelection() {
  const has = !!state.sel;
  $('downloads').hidden = !has;
  $('clear-base').hidden = !state.base;
  if (!has) return;
  const d = digitsFor(state.sel[1] - state.sel[0]);
  let text = `<span class="legend-sel">■</span> ${fmtTime(state.sel[0], d)} + ${fmtSpan(state.sel[1] - state.sel[0])}`;
  if (state.base) {
    text += ` against <span class="legend-base">■</span> base ${fmtTime(state.base[0], d)} + ${fmtSpan(state.base[1] - state.base[0])}`;
  }
  $('sel-text').innerHTML = text;
  const stem = `lightswitch-${state.sel[0]}-${state.sel[1]}`;
  $('dl-pprof').href = mergedUrl('pprof');
  $('dl-pprof').download = `${stem}.pb.gz`;
  $('dl-otlp').href = mergedUrl('otlp');
  $('dl-otlp').download = `${stem}.otlp.pb.gz`;
  $('dl-firefox').href = mergedUrl('firefox');
  $('dl-firefox').download = `${stem}.json.gz`;
}

function renderFilters() {
  const box = $('filters');
  box.textContent = '';
  for (const k of ['host', 'pid', 'tid']) {
    if (!state[k]) continue;
    const chip = document.createElement('span');
    chip.className = 'chip';
    chip.title = 'click to drop this filter';
    chip.textContent = `${k}=${state[k]}`;
    chip.addEventListener('click', () => {
      state[k] = '';
      if (k === 'host') { state.pid = ''; state.tid = ''; }
      if (k === 'pid') state.tid = '';
      writeHash();
      renderFilters();
      if (lastData) renderRows(lastData);
      loadFlame();
    });
    box.appendChild(chip);
  }
}

// ---- the agent's recordings ---------------------------------------------

/** An agent (not a collector) answers GET v1/recordings: offer recording,
 * and without a view in the URL, show its latest recording. */
async function findRecordings(hadView) {
  let response;
  try {
    response = await fetch('v1/recordings');
  } catch (e) {
    return;
  }
  if (!response.ok) return;
  $('record').hidden = false;
  $('record-go').onclick = record;
  const { recordings } = await response.json();
  const last = recordings[recordings.length - 1];
  if (!hadView && last) showRecording(last);
}

function showRecording(r) {
  const from = BigInt(r.from);
  const to = BigInt(r.to);
  const margin = (to - from) / 20n;
  setView(from - margin, to + margin);
}

async function record() {
  const seconds = $('record-seconds').value.trim();
  $('record-go').disabled = true;
  $('status').textContent = '';
  $('record-go').textContent = `● recording ${seconds} s…`;
  try {
    const response = await fetch(`v1/recordings?seconds=${encodeURIComponent(seconds)}`, { method: 'POST' });
    if (!response.ok) $('status').textContent = `recording: ${response.status} ${await response.text()}`;
    else showRecording(await response.json());
  } catch (e) {
    $('status').textContent = `recording: ${e}`;
  } finally {
    $('record-go').disabled = false;
    $('record-go').textContent = '● record';
  }
}

// ---- wiring ---------------------------------------------------------------

function start() {
  const hadView = /(^#|&)from=/.test(location.hash);
  readHash();
  writeHash();
  renderFilters();
  $('zoom-out').onclick = () => zoomBy(2);
  $('zoom-in').onclick = () => zoomBy(0.5);
  $('zoom-sel').onclick = () => state.sel && setView(state.sel[0], state.sel[1]);
  $('pan-left').onclick = () => { const d = (state.to - state.from) / 2n; setView(state.from - d, state.to - d); };
  $('pan-right').onclick = () => { const d = (state.to - state.from) / 2n; setView(state.from + d, state.to + d); };
  $('preset').onchange = (e) => {
    const seconds = BigInt(e.target.value || '0');
    e.target.value = '';
    if (seconds > 0n) { const to = nowNs(); setView(to - seconds * 1_000_000_000n, to); }
  };
  $('clear-base').onclick = () => { state.base = null; writeHash(); drawOverlays(); loadFlame(); };
  $('comm').onchange = (e) => { state.comm = e.target.value.trim(); writeHash(); loadFlame(); };
  window.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && state.base) $('clear-base').onclick();
  });
  let resizeTimer = null;
  window.addEventListener('resize', () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(loadTimeline, 200); });
  window.addEventListener('hashchange', () => { readHash(); renderFilters(); loadTimeline(); loadFlame(); });
  loadTimeline();
  loadFlame();
  findRecordings(hadView);
}

// For scripts and tests: the state, and where a time is drawn.
window.lightswitch = { state, xOf, timeAt, setView };
start();
