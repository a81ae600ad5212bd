// Drives lightswitch's web view in Debian's headless chromium with
// playwright-core, as a person would: zoom, drag across a burst, shift-drag
// a second range, download, reload a shared link. Called by tests/web/main.rs
// with one JSON argument:
//   {"url": "http://127.0.0.1:PORT/", "bursts": "FILE", "out": "DIR",
//    "record_seconds": N | null, "span": ["FROM_NS", "TO_NS"] | null,
//    "token": "T" | null, "chromium": "/usr/bin/chromium"}
// `bursts` is the workload's file of "START_NS END_NS" lines (CLOCK_REALTIME)
// of its critical sections; with `record_seconds` (an agent) the page's
// record button is pressed first, else `span` says when data was taken. Prints one JSON object of what it saw on
// stdout; the Rust test asserts on it. Exits non-zero when a step fails.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const config = JSON.parse(process.argv[2]);
const MS = 1_000_000n;
const TIMEOUT = 30_000;

/** Samples of critical_section in an inferno SVG: its frames' titles,
 * "critical_section (1,234 samples, 5.6%)", added up. */
async function flameCount(page, fn) {
  const frame = page.frameLocator('#flame-frame');
  const titles = await frame.locator('title').allTextContents();
  let total = 0;
  let seen = false;
  for (const t of titles) {
    const m = new RegExp(`^${fn} \\(([\\d,]+) samples?`).exec(t);
    if (m) {
      seen = true;
      total += Number(m[1].replace(/,/g, ''));
    }
  }
  return { seen, total, frames: titles.length };
}

/** Samples whose folded stack holds `fn`, from GET merged?format=folded. */
async function foldedCount(page, range, fn) {
  return page.evaluate(async ([a, b, f]) => {
    const r = await fetch(`v1/profiles/merged?from=${a}&to=${b}&format=folded`);
    if (r.status === 404) return { status: 404, total: 0, count: 0 };
    const text = await r.text();
    let total = 0;
    let count = 0;
    for (const line of text.split('\n')) {
      const m = /^(.*) (\d+)$/.exec(line);
      if (!m) continue;
      total += Number(m[2]);
      if (m[1].split(';').includes(f)) count += Number(m[2]);
    }
    return { status: r.status, total, count };
  }, [range[0].toString(), range[1].toString(), fn]);
}

/** Drag across [a, b) (ns) on the timeline, holding shift if asked. */
async function drag(page, a, b, shift) {
  const [xa, xb, y] = await page.evaluate(([a, b]) => {
    const over = document.querySelector('.u-over').getBoundingClientRect();
    const x = (t) => over.left + (window.lightswitch.xOf(BigInt(t)) - window.lightswitch.xOf(window.lightswitch.state.from));
    return [x(a), x(b), over.top + over.height / 2];
  }, [a.toString(), b.toString()]);
  if (shift) await page.keyboard.down('Shift');
  await page.mouse.move(Math.floor(xa), y);
  await page.mouse.down();
  await page.mouse.move(Math.ceil(xb), y, { steps: 8 });
  await page.mouse.up();
  if (shift) await page.keyboard.up('Shift');
}

function hashOf(page) {
  return Object.fromEntries(new URLSearchParams(new URL(page.url()).hash.slice(1)));
}

async function waitFor(page, attribute, value) {
  try {
    await page.waitForSelector(`body[data-${attribute}="${value}"]`, { timeout: TIMEOUT });
  } catch (e) {
    const seen = await page.evaluate(() => ({
      data: { ...document.body.dataset },
      hash: location.hash,
      status: document.getElementById('status').textContent,
      flame: document.getElementById('flame-status').textContent,
    }));
    await page.screenshot({ path: path.join(config.out, 'web-view-failed.png') });
    throw new Error(`waiting for ${attribute}=${value}: ${JSON.stringify(seen)}\n${e.message}`);
  }
}

/** Show [from, to) as a person pasting a link would: a new fragment. */
async function view(page, from, to, extra = {}) {
  const p = new URLSearchParams({ ...hashOf(page), ...extra, from: from.toString(), to: to.toString() });
  await page.evaluate(() => { document.body.dataset.timeline = 'stale'; });
  await page.evaluate((h) => { location.hash = h; }, p.toString());
  await waitFor(page, 'timeline', 'loaded');
}

async function main() {
  const out = {};
  const browser = await chromium.launch({ executablePath: config.chromium, args: ['--no-sandbox'] });
  // A token is asked for with a Basic challenge, as a person's browser would.
  const httpCredentials = config.token ? { username: 'lightswitch', password: config.token } : undefined;
  const context = await browser.newContext({ viewport: { width: 1600, height: 900 }, acceptDownloads: true, httpCredentials });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(config.url);
  await waitFor(page, 'timeline', 'loaded');

  // [from, to) the data covers: given, or the agent's new recording.
  let span = config.span ? config.span.map(BigInt) : null;
  if (config.record_seconds) {
    await page.fill('#record-seconds', String(config.record_seconds));
    await page.evaluate(() => { document.body.dataset.timeline = 'stale'; });
    await page.click('#record-go');
    await waitFor(page, 'timeline', 'loaded');
    const { recordings } = await page.evaluate(async () => (await fetch('v1/recordings')).json());
    const last = recordings[recordings.length - 1];
    span = [BigInt(last.from), BigInt(last.to)];
    out.recording = last;
  }
  const bursts = fs.readFileSync(config.bursts, 'utf8').trim().split('\n')
    .map((l) => l.split(' ').map(BigInt));
  // A burst well inside the data, with a quiet range 500 ms after it.
  const inside = bursts.filter(([s, e]) => !span || (s - 50n * MS > span[0] && e + 600n * MS < span[1]));
  const [start, end] = inside[Math.floor(inside.length / 2)];
  out.burst = [start.toString(), end.toString()];

  // The burst's neighbourhood: ±5 ms.
  await view(page, start - 5n * MS, end + 5n * MS);
  out.rows = await page.$$eval('.row .label', (ls) => ls.map((l) => l.textContent));
  // Zoom in and out: the fragment follows, the timeline reloads finer.
  const before = hashOf(page);
  await page.evaluate(() => { document.body.dataset.timeline = 'stale'; });
  await page.click('#zoom-in');
  await waitFor(page, 'timeline', 'loaded');
  const zoomed = hashOf(page);
  out.zoom = {
    before: (BigInt(before.to) - BigInt(before.from)).toString(),
    after: (BigInt(zoomed.to) - BigInt(zoomed.from)).toString(),
  };
  await view(page, start - 5n * MS, end + 5n * MS);

  // Drag across the burst, 1 ms either side.
  await page.evaluate(() => { document.body.dataset.flame = 'stale'; });
  await drag(page, start - MS, end + MS, false);
  await waitFor(page, 'flame', 'loaded');
  let h = hashOf(page);
  const sel = h.sel.split('-').map(BigInt);
  out.selected = { sel: h.sel, flame: await flameCount(page, 'critical_section'), merged: await foldedCount(page, sel, 'critical_section') };

  // A second range before the burst (shift-drag): the differential graph.
  await page.evaluate(() => { document.body.dataset.flame = 'stale'; });
  await drag(page, start - 5n * MS + 200_000n, start - 2n * MS, true);
  await waitFor(page, 'flame', 'diff');
  h = hashOf(page);
  const diffTitle = await page.frameLocator('#flame-frame').locator('#title').textContent();
  out.diff = { base: h.base, title: diffTitle, flame: await flameCount(page, 'critical_section') };
  await page.screenshot({ path: path.join(config.out, 'web-view-diff.png') });

  // The shared link reloads the same view in a fresh page.
  const link = page.url();
  const again = await context.newPage();
  again.on('pageerror', (e) => errors.push(e.message));
  await again.goto(link);
  await waitFor(again, 'timeline', 'loaded');
  await waitFor(again, 'flame', 'diff');
  out.reload = { same_url: again.url() === link, flame: await flameCount(again, 'critical_section') };
  await again.close();

  // Downloads of the selected range.
  out.downloads = {};
  for (const [id, name] of [['dl-pprof', 'range.pb.gz'], ['dl-otlp', 'range.otlp.pb.gz'], ['dl-firefox', 'range.json.gz']]) {
    const [download] = await Promise.all([page.waitForEvent('download', { timeout: TIMEOUT }), page.click(`#${id}`)]);
    const file = path.join(config.out, name);
    await download.saveAs(file);
    out.downloads[id] = file;
  }

  // Drop the base, then a range as long, 500 ms later, between bursts.
  await page.click('#clear-base');
  // Under load the busy threads may get no CPU for a few ms: take the
  // first of a few offsets whose range holds samples at all.
  let quiet = null;
  for (const ms of [500n, 400n, 600n, 300n, 700n]) {
    quiet = [sel[0] + ms * MS, sel[1] + ms * MS];
    if ((await foldedCount(page, quiet, 'critical_section')).total > 0) break;
  }
  await view(page, quiet[0] - 5n * MS, quiet[1] + 5n * MS);
  await page.evaluate(() => { document.body.dataset.flame = 'stale'; });
  await drag(page, quiet[0], quiet[1], false);
  await waitFor(page, 'flame', 'loaded');
  h = hashOf(page);
  out.quiet = {
    sel: h.sel,
    flame: await flameCount(page, 'critical_section'),
    merged: await foldedCount(page, h.sel.split('-').map(BigInt), 'critical_section'),
  };
  await page.screenshot({ path: path.join(config.out, 'web-view-quiet.png') });
  await view(page, start - 5n * MS, end + 5n * MS, { sel: out.selected.sel });
  await waitFor(page, 'flame', 'loaded');
  await page.screenshot({ path: path.join(config.out, 'web-view.png') });
  // The whole span, the burst still selected.
  await view(page, span[0], span[1]);
  await page.screenshot({ path: path.join(config.out, 'web-view-overview.png') });
  out.errors = errors;
  await browser.close();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  process.stderr.write(`drive.js: ${e.stack || e}\n`);
  process.exit(1);
});
