"""What a run reports: the rows assertions emit (``recording``), the terminal summary, the JSON
report and the HTML page. Imports ``runtime`` and ``verdict`` only.
"""
