-- One statement set: one job, one checkpoint covering every output.
INSERT INTO inference_window_sink SELECT * FROM inference_window_stats;
INSERT INTO late_sink SELECT * FROM late_rows;
INSERT INTO rejected_sink SELECT * FROM rejected_rows;
