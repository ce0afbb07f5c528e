-- One statement set: one job, one checkpoint covering both outputs.
INSERT INTO inference_window_sink SELECT * FROM inference_window_stats;
INSERT INTO late_sink SELECT * FROM late_rows;
