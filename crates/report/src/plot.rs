//! Plots of result tables as SVG, drawn with `plotters`: one chart type (lines and
//! markers over numeric axes, a legend, optional point labels) that every plot uses.

use plotters::coord::Shift;
use plotters::prelude::*;

/// How a series' points are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    Solid,
    Dashed,
    Dotted,
    None,
}

/// How each point is marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    None,
    /// A filled circle (measured values).
    Filled,
    /// A hollow circle (published values).
    Hollow,
    /// A one-pixel dot (scatter plots of many points).
    Dot,
}

/// One series: its points (NaN values are left out), style and legend entry.
#[derive(Debug, Clone)]
pub struct Series {
    pub legend: Option<String>,
    /// Index into the palette.
    pub colour: usize,
    pub line: Line,
    pub marker: Marker,
    pub width: u32,
    pub points: Vec<(f64, f64)>,
    /// A label beside each point (empty: none).
    pub point_labels: Vec<String>,
}

impl Series {
    pub fn new(colour: usize, line: Line, marker: Marker, points: Vec<(f64, f64)>) -> Series {
        Series {
            legend: None,
            colour,
            line,
            marker,
            width: 2,
            points,
            point_labels: Vec::new(),
        }
    }

    pub fn legend(mut self, text: impl Into<String>) -> Series {
        self.legend = Some(text.into());
        self
    }
}

/// A chart: title, axis descriptions, size in pixels, series. The y axis starts at 0.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub size: (u32, u32),
    pub series: Vec<Series>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

impl Chart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, self.size).into_drawing_area();
            // Drawing into a String cannot fail for I/O; a failure here is a bug.
            if let Err(e) = self.draw(&root) {
                unreachable!("drawing into a String failed: {e}");
            }
            root.present().expect("plot drawing");
        }
        out
    }

    /// (x range, y range) over every finite point, padded; y from 0.
    fn ranges(&self) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
        let pts = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|p| p.0.is_finite() && p.1.is_finite())
        };
        let xmin = pts().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let xmax = pts().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let ymax = pts().map(|p| p.1).fold(0.0, f64::max);
        let (xmin, xmax) = match (xmin.is_finite(), xmax > xmin) {
            (false, _) => (0.0, 1.0),
            (true, true) => (xmin - 0.03 * (xmax - xmin), xmax + 0.03 * (xmax - xmin)),
            (true, false) => (
                xmin - 0.5 * xmin.abs().max(1.0),
                xmin + 0.5 * xmin.abs().max(1.0),
            ),
        };
        let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
        (xmin..xmax, 0.0..ymax)
    }

    fn draw(&self, root: &DrawingArea<SVGBackend, Shift>) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        root.fill(&WHITE).map_err(e)?;
        let (xr, yr) = self.ranges();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xr, yr)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_desc)
            .y_desc(&self.y_desc)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(e)?;
        for s in &self.series {
            draw_series(&mut chart, s).map_err(e)?;
        }
        if self.series.iter().any(|s| s.legend.is_some()) {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(e)?;
        }
        Ok(())
    }
}

type Cartesian<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn draw_series(chart: &mut Cartesian<'_, '_>, s: &Series) -> DrawResult {
    let colour = PALETTE[s.colour % PALETTE.len()];
    let style = colour.stroke_width(s.width);
    let pts: Vec<(f64, f64)> = s
        .points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let mut labelled = false;
    let anno = match s.line {
        Line::Solid => Some(chart.draw_series(LineSeries::new(pts.clone(), style))?),
        Line::Dashed => Some(chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?),
        Line::Dotted => Some(chart.draw_series(DashedLineSeries::new(pts.clone(), 2, 3, style))?),
        Line::None => None,
    };
    if let (Some(text), Some(a)) = (&s.legend, anno) {
        let width = if s.line == Line::Solid { 20 } else { 8 };
        a.label(text)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + width, y)], style));
        labelled = true;
    }
    let size = if s.marker == Marker::Dot { 1 } else { 4 };
    let shape = match s.marker {
        Marker::None => None,
        Marker::Hollow => Some(colour.stroke_width(1)),
        Marker::Filled | Marker::Dot => Some(colour.filled()),
    };
    if let Some(shape) = shape {
        let a = chart.draw_series(pts.iter().map(|&p| Circle::new(p, size, shape)))?;
        if let (Some(text), false) = (&s.legend, labelled) {
            a.label(text)
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, shape));
        }
    }
    let font = ("sans-serif", 10).into_font().color(&colour);
    for (p, label) in pts.iter().zip(&s.point_labels) {
        chart.draw_series(std::iter::once(Text::new(label.clone(), *p, font.clone())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_its_title_axes_series_and_legend() {
        let c = Chart {
            title: "loss <1>".into(),
            x_desc: "load (Mbit/s)".into(),
            y_desc: "loss (%)".into(),
            size: (600, 400),
            series: vec![
                Series::new(0, Line::Solid, Marker::Filled, vec![(1.0, 0.0), (2.0, 3.5)])
                    .legend("ours"),
                Series::new(
                    0,
                    Line::Dashed,
                    Marker::Hollow,
                    vec![(1.0, 1.0), (2.0, f64::NAN)],
                )
                .legend("published"),
            ],
        };
        let svg = c.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for text in [
            "loss &lt;1&gt;",
            "load (Mbit/s)",
            "loss (%)",
            "ours",
            "published",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert_eq!(svg, c.svg(), "the same chart, the same bytes");
    }

    #[test]
    fn an_empty_chart_still_draws() {
        let c = Chart {
            title: "nothing".into(),
            x_desc: String::new(),
            y_desc: String::new(),
            size: (300, 200),
            series: Vec::new(),
        };
        assert!(c.svg().contains("nothing"));
    }
}
