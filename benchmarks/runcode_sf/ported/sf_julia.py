# ruff: noqa
# Ported from SandboxFusion (Apache-2.0), sandbox/tests/runners/test_julia.py: requests and assertions as
# written there; only the imports point at benchmarks.runcode_sf.shim and its
# test-group marks are comments.
# Copyright 2024 Bytedance Ltd. and/or its affiliates
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import pytest

from benchmarks.runcode_sf.shim import CommandRunStatus
from benchmarks.runcode_sf.shim import RunCodeRequest, RunCodeResponse, RunStatus, client



# @pytest.mark.minor: a test group of SandboxFusion's, unused here
def test_julia_print():
    request = RunCodeRequest(language='julia', code='''
println("Hello, World!")
    ''', run_timeout=5)
    response = client.post('/run_code', json=request.model_dump())
    assert response.status_code == 200
    result = RunCodeResponse(**response.json())
    print(result)
    assert result.status == RunStatus.Success
    assert "Hello, World!" in result.run_result.stdout.strip()


# @pytest.mark.minor: a test group of SandboxFusion's, unused here
def test_julia_timeout():
    request = RunCodeRequest(language='julia', code='''
Base.sleep(5)
    ''', run_timeout=5)
    response = client.post('/run_code', json=request.model_dump())
    assert response.status_code == 200
    result = RunCodeResponse(**response.json())
    assert result.status == RunStatus.Failed
    assert result.run_result.status == CommandRunStatus.TimeLimitExceeded


# @pytest.mark.minor: a test group of SandboxFusion's, unused here
def test_julia_assertion_success():
    request = RunCodeRequest(language='julia', code='''
using Test
@testset begin
	@test(0 == 0)
end
    ''')
    response = client.post('/run_code', json=request.model_dump())
    assert response.status_code == 200
    result = RunCodeResponse(**response.json())
    assert result.status == RunStatus.Success
    assert result.run_result.status == CommandRunStatus.Finished


# @pytest.mark.minor: a test group of SandboxFusion's, unused here
def test_julia_assertion_error():
    request = RunCodeRequest(language='julia', code='''
using Test
@testset begin
	@test(1 == 0)
end
    ''')
    response = client.post('/run_code', json=request.model_dump())
    assert response.status_code == 200
    result = RunCodeResponse(**response.json())
    assert result.status == RunStatus.Failed
    assert result.run_result.status == CommandRunStatus.Finished
    assert "Test Failed" in result.run_result.stdout
