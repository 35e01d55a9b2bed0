"""``fedfair report``: an aggregator's run as one self-contained HTML page.

``data`` reads the output folder into plain values, ``figures`` draws them as inline SVG, and
``page`` renders and writes the page (refreshed by the aggregator as it runs).
"""
