# Data and model onto shared storage, once: the archive every job stages, the model cache every job loads.


rule archive_dataset:
    input:
        dataset_locations,
    output:
        archive=PLAN.archive_template,
        manifest=MANIFEST,
    log:
        "logs/archive_dataset/{dataset}.log",
    benchmark:
        "results/benchmarks/archive_dataset/{dataset}.tsv"
    conda:
        "../envs/scratchflow.yaml"
    params:
        dataset=dataset_settings,
        fingerprint=dataset_fingerprint,
    script:
        "../scripts/archive_dataset.py"


# The only step that may download: it runs where the internet is (the login node).
localrules:
    prefetch_model,


rule prefetch_model:
    input:
        model_source_location,
    output:
        directory("models/{model}"),
    log:
        "logs/prefetch_model/{model}.log",
    benchmark:
        "results/benchmarks/prefetch_model/{model}.tsv"
    conda:
        "../envs/scratchflow.yaml"
    params:
        task=config["task"],
        source=MODEL["source"] if MODEL else None,
        fingerprint=model_source_fingerprint,
    script:
        "../scripts/prefetch_model.py"
