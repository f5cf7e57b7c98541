"""What a launch tells Airflow's OpenLineage integration: the job's datasets named by
OpenLineage's conventions (``naming``, pure), the facet that carries its checkpoint and the
lineage built from both (``facets``, which needs ``apache-airflow-providers-openlineage``),
and the ``spark.openlineage.*`` properties that let Spark's own listener report as a child
of the task (``spark``). The operators import the last two only when they are used, so
that they work as before without the OpenLineage provider.
"""
