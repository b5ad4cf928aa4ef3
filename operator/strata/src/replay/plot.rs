//! The replay plot: context tokens per call, one line per policy, compactions marked.

use plotters::prelude::*;
use strata_core::replay::PolicyReport;

const COLORS: [RGBColor; 6] = [
    RGBColor(120, 120, 120),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(204, 121, 167),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
];

/// One policy's line: its name, (call, tokens) points, and the points where it compacted.
type Line<'a> = (&'a str, Vec<(u64, u64)>, Vec<(u64, u64)>);

/// Render the SVG. Sessions are laid end to end on the x axis.
pub fn render(series: &[(String, Vec<&PolicyReport>)]) -> Result<String, Box<dyn std::error::Error>> {
    let lines: Vec<Line<'_>> = series
        .iter()
        .map(|(name, reports)| {
            let mut points = Vec::new();
            let mut compactions = Vec::new();
            for call in reports.iter().flat_map(|r| r.calls.iter()) {
                let x = points.len() as u64;
                points.push((x, call.cost.total));
                if call.compacted {
                    compactions.push((x, call.cost.total));
                }
            }
            (name.as_str(), points, compactions)
        })
        .collect();
    let max_x = lines.iter().map(|(_, p, _)| p.len() as u64).max().unwrap_or(1).max(1);
    let max_y = lines.iter().flat_map(|(_, p, _)| p.iter().map(|(_, y)| *y)).max().unwrap_or(1).max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Context tokens per call (compactions marked)", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0..max_x, 0..max_y + max_y / 10)?;
        chart.configure_mesh().x_desc("model call").y_desc("prompt tokens").draw()?;
        for (index, (name, points, compactions)) in lines.iter().enumerate() {
            let color = COLORS[index % COLORS.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(
                compactions.iter().map(|&(x, y)| TriangleMarker::new((x, y), 7, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
