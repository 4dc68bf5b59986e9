"""The page that the post-mortem report and the live status page share: one HTML template
with its script and styles (``assets/``), the uPlot charting library vendored beside them
(``assets/vendor/``, MIT), and what it draws (``rules/report.yaml``, read by ``spec``).

``render`` fills the template: a report inlines its document, the status page names the
API it fetches the same document from (``page/document.py`` shapes both;
``recording/report.py`` and ``serve/status.py`` fill them).
"""
