"""The SLOs and thresholds of one set of settings, written into the files other systems
read: Prometheus rules (plain, or as the Prometheus Operator's PrometheusRule) and the
Grafana dashboard. The bundled files are what the defaults render (a test keeps them so)."""
