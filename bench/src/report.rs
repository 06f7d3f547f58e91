//! The report: durations as the tables show them, one row as printed, and the chart of wait times.

use super::*;

pub(crate) fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

/// Writes the wait-time CDFs of the two hot-key scenarios as an SVG.
pub(crate) fn chart(
    path: &std::path::Path,
    panels: &[(&str, Vec<&Measured>)],
) -> Result<(), Error> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, (title, rows)) in areas.iter().zip(panels) {
        let max_us = rows
            .iter()
            .filter_map(|m| m.waits.last())
            .map(|d| d.as_secs_f64() * 1e6)
            .fold(10.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(*title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((1f64..max_us * 1.2).log_scale(), 0f64..100f64)?;
        chart
            .configure_mesh()
            .x_desc("acquire wait (µs, log scale)")
            .y_desc("% of acquisitions at or below")
            .draw()?;
        for (i, m) in rows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let n = m.waits.len().max(1) as f64;
            let step = (m.waits.len() / 400).max(1);
            let points: Vec<(f64, f64)> = m
                .waits
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(j, w)| ((w.as_secs_f64() * 1e6).max(1.0), (j + 1) as f64 * 100.0 / n))
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(m.lib.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Allocations per section as the tables show them (`-` where not
/// counted: hand-offs, memory growth, rows of other processes).
pub(crate) fn fmt_allocations(allocations: Option<f64>) -> String {
    match allocations {
        Some(n) if n < 100.0 => format!("{n:.1}"),
        Some(n) => format!("{n:.0}"),
        None => "-".to_owned(),
    }
}

/// One row as printed while the benchmark runs.
pub(crate) fn row_line(m: &Measured) -> String {
    // A hand-off row counts hand-offs, not a rate.
    let rate = if m.elapsed.is_zero() {
        "-".to_owned()
    } else {
        format!("{:.0}/s", m.throughput())
    };
    format!(
        "{:<48} {:<14} {:>12}  p50 {:>9}  p99 {:>9}  max {:>9}  allocs {:>5} {}",
        m.scenario,
        m.lib,
        rate,
        fmt_d(m.pct(50.0)),
        fmt_d(m.pct(99.0)),
        fmt_d(m.waits.last().copied().unwrap_or_default()),
        fmt_allocations(m.allocations),
        match m.paired.filter(|_| m.lib != "floor") {
            Some(paired) => {
                let rounds: Vec<String> = m.rounds.iter().map(|r| format!("{r:.2}")).collect();
                format!("paired {paired:.2}x [{}]", rounds.join(" "))
            }
            None => m.note.clone().unwrap_or_default(),
        }
    )
}
