"""The project's own measurement campaigns (multi-GPU scaling, the serving path, the front door, the live A/B
router's cost, client abuse, the abuse soak, the abandonment trials): how the results/ were measured, apart
from the load-testing tool a user runs (fusedresnet.loadtest), as llm.c keeps dev/ apart from what ships."""
