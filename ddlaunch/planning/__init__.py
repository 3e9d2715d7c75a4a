"""Pure planning: config + cluster facts -> launch plan -> batch script (plan, render, fabric,
topology). No I/O besides reading the templates."""
