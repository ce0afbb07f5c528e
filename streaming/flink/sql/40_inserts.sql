-- One statement set: one job, one checkpoint covering all three outputs.
INSERT INTO inference_window_sink SELECT * FROM inference_window_stats;
INSERT INTO rum_window_sink SELECT * FROM rum_window_stats;
INSERT INTO late_sink SELECT * FROM late_rows;
