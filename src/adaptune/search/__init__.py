"""The search: the knob space of a task (``space``), what the loop knows so far (``state``), the
XGBoost cost model, Chameleon's adaptive sampling and the strategies that propose candidates."""
