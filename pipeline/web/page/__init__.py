"""The page: the Blocks layout, its controls and events, and the generate handler the page and ``/generate`` share."""
