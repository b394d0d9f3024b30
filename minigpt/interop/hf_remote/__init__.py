"""Code that minigpt writes into the Hugging Face folders of models no transformers class computes (its
technique switches), for `trust_remote_code=True`; minigpt itself never imports it.

    configuration_minigpt.py   MiniGPTConfig: the model's switches and sizes, config.json's keys
    modeling_minigpt.py        MiniGPTForCausalLM: the forward pass, written out again with torch alone
"""
