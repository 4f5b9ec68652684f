// Metrics: charts of this node's /metrics over the last minutes — rows written per second,
// flush latency, fdatasyncs per second, queries per second and the largest replica lag.
import { fill, h } from "../dom.js";
import { chart } from "../chart.js";
import { max, rate, sample, series, total } from "../metrics.js";

const QUERY = 'route="/v1/tables/{table}/query"';

export function mount(el) {
  const charts = h("div", { id: "charts" });
  fill(el, h("h2", {}, "Metrics"), h("p", { class: "muted" }, "This node's /metrics, sampled every 2 s while the page is open."), charts);
  async function refresh() {
    await sample();
    fill(charts,
      chart("rows-per-s", "Rows written / s", rate((m) => total(m, "terrascale_rows_written_total"))),
      chart("flush-ms", "Flush latency (ms per flush)", rate((m) => 1000 * total(m, "terrascale_flush_seconds"),
        (m) => total(m, "terrascale_flushes")), " ms"),
      chart("fsync-per-s", "fdatasyncs / s", rate((m) => total(m, "terrascale_device_fdatasyncs"))),
      chart("queries-per-s", "Queries / s", rate((m) => total(m, "terrascale_http_requests_total", QUERY) ?? 0)), // none yet: 0
      chart("lag-bytes", "Largest replica lag (bytes)", series((m) => max(m, "terrascale_partition_replica_lag_bytes")), " B"));
  }
  return { refresh, every: 2000 };
}
