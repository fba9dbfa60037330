"""The attributes of every operator schema of onnx 1.23.2, as ``onnx.defs`` holds them.

Written by ``scripts/update_onnx_schemas.py``; do not edit. :func:`policyport.graph.model.schema_attributes`
reads it when the installed onnx is this version, and asks ``onnx.defs`` otherwise.
"""

ONNX_VERSION = '1.23.2'

#: (domain, op type) -> {since version: ((attribute, AttributeProto type code, required), ...)}
SCHEMAS = {
    ('', 'Abs'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'Acos'): {
        7: (),
        22: (),
    },
    ('', 'Acosh'): {
        9: (),
        22: (),
    },
    ('', 'Add'): {
        1: (('axis', 2, False), ('consumed_inputs', 7, False), ('broadcast', 2, False)),
        6: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        13: (),
        14: (),
    },
    ('', 'AffineGrid'): {
        20: (('align_corners', 2, False),),
    },
    ('', 'And'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
    },
    ('', 'ArgMax'): {
        1: (('keepdims', 2, False), ('axis', 2, False)),
        11: (('keepdims', 2, False), ('axis', 2, False)),
        12: (('select_last_index', 2, False), ('keepdims', 2, False), ('axis', 2, False)),
        13: (('select_last_index', 2, False), ('keepdims', 2, False), ('axis', 2, False)),
    },
    ('', 'ArgMin'): {
        1: (('keepdims', 2, False), ('axis', 2, False)),
        11: (('keepdims', 2, False), ('axis', 2, False)),
        12: (('select_last_index', 2, False), ('keepdims', 2, False), ('axis', 2, False)),
        13: (('select_last_index', 2, False), ('keepdims', 2, False), ('axis', 2, False)),
    },
    ('', 'Asin'): {
        7: (),
        22: (),
    },
    ('', 'Asinh'): {
        9: (),
        22: (),
    },
    ('', 'Atan'): {
        7: (),
        22: (),
    },
    ('', 'Atanh'): {
        9: (),
        22: (),
    },
    ('', 'Attention'): {
        23: (('qk_matmul_output_mode', 2, False), ('softcap', 1, False), ('softmax_precision', 2, False), ('kv_num_heads', 2, False), ('q_num_heads', 2, False), ('scale', 1, False), ('is_causal', 2, False)),
        24: (('qk_matmul_output_mode', 2, False), ('softcap', 1, False), ('softmax_precision', 2, False), ('kv_num_heads', 2, False), ('q_num_heads', 2, False), ('scale', 1, False), ('is_causal', 2, False)),
        25: (('right_window_size', 2, False), ('left_window_size', 2, False), ('qk_matmul_output_mode', 2, False), ('softcap', 1, False), ('softmax_precision', 2, False), ('kv_num_heads', 2, False), ('q_num_heads', 2, False), ('scale', 1, False), ('is_causal', 2, False)),
    },
    ('', 'AveragePool'): {
        1: (('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        7: (('count_include_pad', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        10: (('count_include_pad', 2, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        11: (('count_include_pad', 2, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        19: (('count_include_pad', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        22: (('count_include_pad', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
    },
    ('', 'BatchNormalization'): {
        1: (('consumed_inputs', 7, True), ('momentum', 1, False), ('epsilon', 1, False), ('is_test', 2, False), ('spatial', 2, False)),
        6: (('momentum', 1, False), ('epsilon', 1, False), ('is_test', 2, False), ('spatial', 2, False)),
        7: (('momentum', 1, False), ('epsilon', 1, False), ('spatial', 2, False)),
        9: (('momentum', 1, False), ('epsilon', 1, False)),
        14: (('training_mode', 2, False), ('momentum', 1, False), ('epsilon', 1, False)),
        15: (('training_mode', 2, False), ('momentum', 1, False), ('epsilon', 1, False)),
    },
    ('', 'Bernoulli'): {
        15: (('dtype', 2, False), ('seed', 1, False)),
        22: (('dtype', 2, False), ('seed', 1, False)),
    },
    ('', 'BitCast'): {
        26: (('to', 2, True),),
    },
    ('', 'BitShift'): {
        11: (('direction', 3, True),),
        28: (('direction', 3, True),),
    },
    ('', 'BitwiseAnd'): {
        18: (),
    },
    ('', 'BitwiseNot'): {
        18: (),
    },
    ('', 'BitwiseOr'): {
        18: (),
    },
    ('', 'BitwiseXor'): {
        18: (),
    },
    ('', 'BlackmanWindow'): {
        17: (('periodic', 2, False), ('output_datatype', 2, False)),
    },
    ('', 'Cast'): {
        1: (('to', 3, True),),
        6: (('to', 2, True),),
        9: (('to', 2, True),),
        13: (('to', 2, True),),
        19: (('saturate', 2, False), ('to', 2, True)),
        21: (('saturate', 2, False), ('to', 2, True)),
        23: (('saturate', 2, False), ('to', 2, True)),
        24: (('round_mode', 3, False), ('saturate', 2, False), ('to', 2, True)),
        25: (('round_mode', 3, False), ('saturate', 2, False), ('to', 2, True)),
        28: (('round_mode', 3, False), ('saturate', 2, False), ('to', 2, True)),
    },
    ('', 'CastLike'): {
        15: (),
        19: (('saturate', 2, False),),
        21: (('saturate', 2, False),),
        23: (('saturate', 2, False),),
        24: (('round_mode', 3, False), ('saturate', 2, False)),
        25: (('round_mode', 3, False), ('saturate', 2, False)),
    },
    ('', 'CausalConvWithState'): {
        27: (('activation', 3, False),),
    },
    ('', 'Ceil'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'Celu'): {
        12: (('alpha', 1, False),),
        28: (('alpha', 1, False),),
    },
    ('', 'CenterCropPad'): {
        18: (('axes', 7, False),),
    },
    ('', 'Clip'): {
        1: (('consumed_inputs', 7, False), ('max', 1, False), ('min', 1, False)),
        6: (('max', 1, False), ('min', 1, False)),
        11: (),
        12: (),
        13: (),
    },
    ('', 'Col2Im'): {
        18: (('strides', 7, False), ('pads', 7, False), ('dilations', 7, False)),
    },
    ('', 'Compress'): {
        9: (('axis', 2, False),),
        11: (('axis', 2, False),),
        28: (('axis', 2, False),),
    },
    ('', 'Concat'): {
        1: (('axis', 2, False),),
        4: (('axis', 2, True),),
        11: (('axis', 2, True),),
        13: (('axis', 2, True),),
    },
    ('', 'ConcatFromSequence'): {
        11: (('new_axis', 2, False), ('axis', 2, True)),
    },
    ('', 'Constant'): {
        1: (('value', 4, True),),
        9: (('value', 4, True),),
        11: (('sparse_value', 11, False), ('value', 4, False)),
        12: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        13: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        19: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        21: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        23: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        24: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
        25: (('value_strings', 8, False), ('value_string', 3, False), ('value_floats', 6, False), ('value_float', 1, False), ('value_ints', 7, False), ('value_int', 2, False), ('sparse_value', 11, False), ('value', 4, False)),
    },
    ('', 'ConstantOfShape'): {
        9: (('value', 4, False),),
        20: (('value', 4, False),),
        21: (('value', 4, False),),
        23: (('value', 4, False),),
        24: (('value', 4, False),),
        25: (('value', 4, False),),
    },
    ('', 'Conv'): {
        1: (('group', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('dilations', 7, False), ('kernel_shape', 7, False)),
        11: (('group', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('dilations', 7, False), ('kernel_shape', 7, False)),
        22: (('group', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('dilations', 7, False), ('kernel_shape', 7, False)),
    },
    ('', 'ConvInteger'): {
        10: (('group', 2, False), ('pads', 7, False), ('strides', 7, False), ('dilations', 7, False), ('kernel_shape', 7, False), ('auto_pad', 3, False)),
    },
    ('', 'ConvTranspose'): {
        1: (('group', 2, False), ('auto_pad', 3, False), ('strides', 7, False), ('pads', 7, False), ('output_padding', 7, False), ('dilations', 7, False), ('output_shape', 7, False), ('kernel_shape', 7, False)),
        11: (('group', 2, False), ('auto_pad', 3, False), ('strides', 7, False), ('pads', 7, False), ('output_padding', 7, False), ('dilations', 7, False), ('output_shape', 7, False), ('kernel_shape', 7, False)),
        22: (('group', 2, False), ('auto_pad', 3, False), ('strides', 7, False), ('pads', 7, False), ('output_padding', 7, False), ('dilations', 7, False), ('output_shape', 7, False), ('kernel_shape', 7, False)),
    },
    ('', 'Cos'): {
        7: (),
        22: (),
    },
    ('', 'Cosh'): {
        9: (),
        22: (),
    },
    ('', 'CumProd'): {
        26: (('reverse', 2, False), ('exclusive', 2, False)),
    },
    ('', 'CumSum'): {
        11: (('reverse', 2, False), ('exclusive', 2, False)),
        14: (('reverse', 2, False), ('exclusive', 2, False)),
    },
    ('', 'DFT'): {
        17: (('inverse', 2, False), ('axis', 2, False), ('onesided', 2, False)),
        20: (('inverse', 2, False), ('onesided', 2, False)),
    },
    ('', 'DeformConv'): {
        19: (('strides', 7, False), ('pads', 7, False), ('offset_group', 2, False), ('kernel_shape', 7, False), ('group', 2, False), ('dilations', 7, False)),
        22: (('strides', 7, False), ('pads', 7, False), ('offset_group', 2, False), ('kernel_shape', 7, False), ('group', 2, False), ('dilations', 7, False)),
    },
    ('', 'DepthToSpace'): {
        1: (('blocksize', 2, True),),
        11: (('mode', 3, False), ('blocksize', 2, True)),
        13: (('mode', 3, False), ('blocksize', 2, True)),
        28: (('mode', 3, False), ('blocksize', 2, True)),
    },
    ('', 'DequantizeLinear'): {
        10: (),
        13: (('axis', 2, False),),
        19: (('axis', 2, False),),
        21: (('block_size', 2, False), ('axis', 2, False)),
        23: (('output_dtype', 2, False), ('block_size', 2, False), ('axis', 2, False)),
        24: (('output_dtype', 2, False), ('block_size', 2, False), ('axis', 2, False)),
        25: (('output_dtype', 2, False), ('block_size', 2, False), ('axis', 2, False)),
        28: (('output_dtype', 2, False), ('block_size', 2, False), ('axis', 2, False)),
    },
    ('', 'Det'): {
        11: (),
        22: (),
    },
    ('', 'Div'): {
        1: (('axis', 2, False), ('consumed_inputs', 7, False), ('broadcast', 2, False)),
        6: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        13: (),
        14: (),
    },
    ('', 'Dropout'): {
        1: (('is_test', 2, False), ('consumed_inputs', 7, False), ('ratio', 1, False)),
        6: (('is_test', 2, False), ('ratio', 1, False)),
        7: (('ratio', 1, False),),
        10: (('ratio', 1, False),),
        12: (('seed', 2, False),),
        13: (('seed', 2, False),),
        22: (('seed', 2, False),),
    },
    ('', 'DynamicQuantizeLinear'): {
        11: (),
    },
    ('', 'Einsum'): {
        12: (('equation', 3, True),),
        28: (('equation', 3, True),),
    },
    ('', 'Elu'): {
        1: (('consumed_inputs', 7, False), ('alpha', 1, False)),
        6: (('alpha', 1, False),),
        22: (('alpha', 1, False),),
    },
    ('', 'Equal'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        11: (),
        13: (),
        19: (),
    },
    ('', 'Erf'): {
        9: (),
        13: (),
    },
    ('', 'Exp'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'Expand'): {
        8: (),
        13: (),
    },
    ('', 'EyeLike'): {
        9: (('dtype', 2, False), ('k', 2, False)),
        22: (('dtype', 2, False), ('k', 2, False)),
    },
    ('', 'Flatten'): {
        1: (('axis', 2, False),),
        9: (('axis', 2, False),),
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
        21: (('axis', 2, False),),
        23: (('axis', 2, False),),
        24: (('axis', 2, False),),
        25: (('axis', 2, False),),
    },
    ('', 'Floor'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'GRU'): {
        1: (('clip', 1, False), ('activation_beta', 6, False), ('output_sequence', 2, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('activations', 8, False)),
        3: (('clip', 1, False), ('activation_beta', 6, False), ('output_sequence', 2, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('linear_before_reset', 2, False), ('activations', 8, False)),
        7: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('linear_before_reset', 2, False), ('activations', 8, False)),
        14: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('layout', 2, False), ('direction', 3, False), ('linear_before_reset', 2, False), ('activations', 8, False)),
        22: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('layout', 2, False), ('direction', 3, False), ('linear_before_reset', 2, False), ('activations', 8, False)),
    },
    ('', 'Gather'): {
        1: (('axis', 2, False),),
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
    },
    ('', 'GatherElements'): {
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
    },
    ('', 'GatherND'): {
        11: (),
        12: (('batch_dims', 2, False),),
        13: (('batch_dims', 2, False),),
    },
    ('', 'Gelu'): {
        20: (('approximate', 3, False),),
    },
    ('', 'Gemm'): {
        1: (('beta', 1, False), ('broadcast', 2, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
        6: (('beta', 1, False), ('broadcast', 2, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
        7: (('beta', 1, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
        9: (('beta', 1, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
        11: (('beta', 1, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
        13: (('beta', 1, False), ('transB', 2, False), ('alpha', 1, False), ('transA', 2, False)),
    },
    ('', 'GlobalAveragePool'): {
        1: (),
        22: (),
    },
    ('', 'GlobalLpPool'): {
        1: (('p', 1, False),),
        2: (('p', 2, False),),
        22: (('p', 2, False),),
    },
    ('', 'GlobalMaxPool'): {
        1: (),
        22: (),
    },
    ('', 'Greater'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        9: (),
        13: (),
    },
    ('', 'GreaterOrEqual'): {
        12: (),
        16: (),
    },
    ('', 'GridSample'): {
        16: (('align_corners', 2, False), ('padding_mode', 3, False), ('mode', 3, False)),
        20: (('align_corners', 2, False), ('padding_mode', 3, False), ('mode', 3, False)),
        22: (('align_corners', 2, False), ('padding_mode', 3, False), ('mode', 3, False)),
    },
    ('', 'GroupNormalization'): {
        18: (('num_groups', 2, True), ('epsilon', 1, False)),
        21: (('stash_type', 2, False), ('num_groups', 2, True), ('epsilon', 1, False)),
    },
    ('', 'HammingWindow'): {
        17: (('periodic', 2, False), ('output_datatype', 2, False)),
    },
    ('', 'HannWindow'): {
        17: (('periodic', 2, False), ('output_datatype', 2, False)),
    },
    ('', 'HardSigmoid'): {
        1: (('consumed_inputs', 7, False), ('beta', 1, False), ('alpha', 1, False)),
        6: (('beta', 1, False), ('alpha', 1, False)),
        22: (('beta', 1, False), ('alpha', 1, False)),
    },
    ('', 'HardSwish'): {
        14: (),
        22: (),
    },
    ('', 'Hardmax'): {
        1: (('axis', 2, False),),
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
    },
    ('', 'Identity'): {
        1: (),
        13: (),
        14: (),
        16: (),
        19: (),
        21: (),
        23: (),
        24: (),
        25: (),
    },
    ('', 'If'): {
        1: (('else_branch', 5, True), ('then_branch', 5, True)),
        11: (('else_branch', 5, True), ('then_branch', 5, True)),
        13: (('else_branch', 5, True), ('then_branch', 5, True)),
        16: (('else_branch', 5, True), ('then_branch', 5, True)),
        19: (('else_branch', 5, True), ('then_branch', 5, True)),
        21: (('else_branch', 5, True), ('then_branch', 5, True)),
        23: (('else_branch', 5, True), ('then_branch', 5, True)),
        24: (('else_branch', 5, True), ('then_branch', 5, True)),
        25: (('else_branch', 5, True), ('then_branch', 5, True)),
    },
    ('', 'ImageDecoder'): {
        20: (('pixel_format', 3, False),),
    },
    ('', 'InstanceNormalization'): {
        1: (('epsilon', 1, False), ('consumed_inputs', 7, False)),
        6: (('epsilon', 1, False),),
        22: (('epsilon', 1, False),),
    },
    ('', 'IsInf'): {
        10: (('detect_negative', 2, False), ('detect_positive', 2, False)),
        20: (('detect_negative', 2, False), ('detect_positive', 2, False)),
    },
    ('', 'IsNaN'): {
        9: (),
        13: (),
        20: (),
    },
    ('', 'LRN'): {
        1: (('bias', 1, False), ('beta', 1, False), ('alpha', 1, False), ('size', 2, True)),
        13: (('bias', 1, False), ('beta', 1, False), ('alpha', 1, False), ('size', 2, True)),
    },
    ('', 'LSTM'): {
        1: (('clip', 1, False), ('activation_beta', 6, False), ('output_sequence', 2, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('input_forget', 2, False), ('activations', 8, False)),
        7: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('input_forget', 2, False), ('activations', 8, False)),
        14: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('input_forget', 2, False), ('layout', 2, False), ('activations', 8, False)),
        22: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('input_forget', 2, False), ('layout', 2, False), ('activations', 8, False)),
    },
    ('', 'LayerNormalization'): {
        17: (('stash_type', 2, False), ('epsilon', 1, False), ('axis', 2, False)),
    },
    ('', 'LeakyRelu'): {
        1: (('consumed_inputs', 7, False), ('alpha', 1, False)),
        6: (('alpha', 1, False),),
        16: (('alpha', 1, False),),
    },
    ('', 'Less'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        9: (),
        13: (),
    },
    ('', 'LessOrEqual'): {
        12: (),
        16: (),
    },
    ('', 'LinearAttention'): {
        27: (('chunk_size', 2, False), ('kv_num_heads', 2, True), ('q_num_heads', 2, True), ('scale', 1, False), ('update_rule', 3, False)),
    },
    ('', 'Log'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'LogSoftmax'): {
        1: (('axis', 2, False),),
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
    },
    ('', 'Loop'): {
        1: (('body', 5, True),),
        11: (('body', 5, True),),
        13: (('body', 5, True),),
        16: (('body', 5, True),),
        19: (('body', 5, True),),
        21: (('body', 5, True),),
        23: (('body', 5, True),),
        24: (('body', 5, True),),
        25: (('body', 5, True),),
    },
    ('', 'LpNormalization'): {
        1: (('p', 2, False), ('axis', 2, False)),
        22: (('p', 2, False), ('axis', 2, False)),
    },
    ('', 'LpPool'): {
        1: (('p', 1, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, False)),
        2: (('p', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        11: (('p', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        18: (('p', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('ceil_mode', 2, False), ('dilations', 7, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        22: (('p', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('ceil_mode', 2, False), ('dilations', 7, False), ('strides', 7, False), ('kernel_shape', 7, True)),
    },
    ('', 'MatMul'): {
        1: (),
        9: (),
        13: (),
    },
    ('', 'MatMulInteger'): {
        10: (),
    },
    ('', 'Max'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        8: (),
        12: (),
        13: (),
    },
    ('', 'MaxPool'): {
        1: (('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        8: (('storage_order', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        10: (('storage_order', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        11: (('storage_order', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        12: (('storage_order', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        22: (('storage_order', 2, False), ('dilations', 7, False), ('ceil_mode', 2, False), ('pads', 7, False), ('auto_pad', 3, False), ('strides', 7, False), ('kernel_shape', 7, True)),
    },
    ('', 'MaxRoiPool'): {
        1: (('spatial_scale', 1, False), ('pooled_shape', 7, True)),
        22: (('spatial_scale', 1, False), ('pooled_shape', 7, True)),
    },
    ('', 'MaxUnpool'): {
        9: (('pads', 7, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        11: (('pads', 7, False), ('strides', 7, False), ('kernel_shape', 7, True)),
        22: (('pads', 7, False), ('strides', 7, False), ('kernel_shape', 7, True)),
    },
    ('', 'Mean'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        8: (),
        13: (),
    },
    ('', 'MeanVarianceNormalization'): {
        9: (('axes', 7, False),),
        13: (('axes', 7, False),),
    },
    ('', 'MelWeightMatrix'): {
        17: (('output_datatype', 2, False),),
    },
    ('', 'Min'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        8: (),
        12: (),
        13: (),
    },
    ('', 'Mish'): {
        18: (),
        22: (),
    },
    ('', 'Mod'): {
        10: (('fmod', 2, False),),
        13: (('fmod', 2, False),),
        28: (('fmod', 2, False),),
    },
    ('', 'Mul'): {
        1: (('axis', 2, False), ('consumed_inputs', 7, False), ('broadcast', 2, False)),
        6: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        13: (),
        14: (),
    },
    ('', 'Multinomial'): {
        7: (('dtype', 2, False), ('seed', 1, False), ('sample_size', 2, False)),
        22: (('dtype', 2, False), ('seed', 1, False), ('sample_size', 2, False)),
    },
    ('', 'Neg'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'NegativeLogLikelihoodLoss'): {
        12: (('ignore_index', 2, False), ('reduction', 3, False)),
        13: (('ignore_index', 2, False), ('reduction', 3, False)),
        22: (('ignore_index', 2, False), ('reduction', 3, False)),
    },
    ('', 'NonMaxSuppression'): {
        10: (('center_point_box', 2, False),),
        11: (('center_point_box', 2, False),),
    },
    ('', 'NonZero'): {
        9: (),
        13: (),
    },
    ('', 'Not'): {
        1: (),
    },
    ('', 'OneHot'): {
        9: (('axis', 2, False),),
        11: (('axis', 2, False),),
        28: (('axis', 2, False),),
    },
    ('', 'Optional'): {
        15: (('type', 13, False),),
        28: (('type', 13, False),),
    },
    ('', 'OptionalGetElement'): {
        15: (),
        18: (),
        28: (),
    },
    ('', 'OptionalHasElement'): {
        15: (),
        18: (),
        28: (),
    },
    ('', 'Or'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
    },
    ('', 'PRelu'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        7: (),
        9: (),
        16: (),
    },
    ('', 'Pad'): {
        1: (('value', 1, False), ('mode', 3, False), ('paddings', 7, True)),
        2: (('value', 1, False), ('mode', 3, False), ('pads', 7, True)),
        11: (('mode', 3, False),),
        13: (('mode', 3, False),),
        18: (('mode', 3, False),),
        19: (('mode', 3, False),),
        21: (('mode', 3, False),),
        23: (('mode', 3, False),),
        24: (('mode', 3, False),),
        25: (('mode', 3, False),),
    },
    ('', 'Pow'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        12: (),
        13: (),
        15: (),
    },
    ('', 'QLinearConv'): {
        10: (('group', 2, False), ('pads', 7, False), ('strides', 7, False), ('dilations', 7, False), ('kernel_shape', 7, False), ('auto_pad', 3, False)),
    },
    ('', 'QLinearMatMul'): {
        10: (),
        21: (),
    },
    ('', 'QuantizeLinear'): {
        10: (),
        13: (('axis', 2, False),),
        19: (('saturate', 2, False), ('axis', 2, False)),
        21: (('output_dtype', 2, False), ('block_size', 2, False), ('saturate', 2, False), ('axis', 2, False)),
        23: (('precision', 2, False), ('output_dtype', 2, False), ('block_size', 2, False), ('saturate', 2, False), ('axis', 2, False)),
        24: (('precision', 2, False), ('output_dtype', 2, False), ('block_size', 2, False), ('saturate', 2, False), ('axis', 2, False)),
        25: (('precision', 2, False), ('output_dtype', 2, False), ('block_size', 2, False), ('saturate', 2, False), ('axis', 2, False)),
        28: (('precision', 2, False), ('output_dtype', 2, False), ('block_size', 2, False), ('saturate', 2, False), ('axis', 2, False)),
    },
    ('', 'RMSNormalization'): {
        23: (('stash_type', 2, False), ('epsilon', 1, False), ('axis', 2, False)),
    },
    ('', 'RNN'): {
        1: (('clip', 1, False), ('activation_beta', 6, False), ('output_sequence', 2, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('activations', 8, False)),
        7: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('direction', 3, False), ('activations', 8, False)),
        14: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('layout', 2, False), ('direction', 3, False), ('activations', 8, False)),
        22: (('clip', 1, False), ('activation_beta', 6, False), ('activation_alpha', 6, False), ('hidden_size', 2, False), ('layout', 2, False), ('direction', 3, False), ('activations', 8, False)),
    },
    ('', 'RandomNormal'): {
        1: (('shape', 7, True), ('dtype', 2, False), ('seed', 1, False), ('scale', 1, False), ('mean', 1, False)),
        22: (('shape', 7, True), ('dtype', 2, False), ('seed', 1, False), ('scale', 1, False), ('mean', 1, False)),
    },
    ('', 'RandomNormalLike'): {
        1: (('dtype', 2, False), ('seed', 1, False), ('scale', 1, False), ('mean', 1, False)),
        22: (('dtype', 2, False), ('seed', 1, False), ('scale', 1, False), ('mean', 1, False)),
    },
    ('', 'RandomUniform'): {
        1: (('shape', 7, True), ('dtype', 2, False), ('seed', 1, False), ('high', 1, False), ('low', 1, False)),
        22: (('shape', 7, True), ('dtype', 2, False), ('seed', 1, False), ('high', 1, False), ('low', 1, False)),
    },
    ('', 'RandomUniformLike'): {
        1: (('dtype', 2, False), ('seed', 1, False), ('high', 1, False), ('low', 1, False)),
        22: (('dtype', 2, False), ('seed', 1, False), ('high', 1, False), ('low', 1, False)),
    },
    ('', 'Range'): {
        11: (),
        27: (('stash_type', 2, False),),
    },
    ('', 'Reciprocal'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'ReduceL1'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceL2'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceLogSum'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
        28: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceLogSumExp'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
        28: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceMax'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        12: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
        20: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceMean'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceMin'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        12: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
        20: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceProd'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceSum'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'ReduceSumSquare'): {
        1: (('keepdims', 2, False), ('axes', 7, False)),
        11: (('keepdims', 2, False), ('axes', 7, False)),
        13: (('axes', 7, False), ('keepdims', 2, False)),
        18: (('noop_with_empty_axes', 2, False), ('keepdims', 2, False)),
    },
    ('', 'RegexFullMatch'): {
        20: (('pattern', 3, False),),
    },
    ('', 'Relu'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
        14: (),
    },
    ('', 'Reshape'): {
        1: (('consumed_inputs', 7, False), ('shape', 7, False)),
        5: (),
        13: (),
        14: (('allowzero', 2, False),),
        19: (('allowzero', 2, False),),
        21: (('allowzero', 2, False),),
        23: (('allowzero', 2, False),),
        24: (('allowzero', 2, False),),
        25: (('allowzero', 2, False),),
    },
    ('', 'Resize'): {
        10: (('mode', 3, False),),
        11: (('extrapolation_value', 1, False), ('exclude_outside', 2, False), ('nearest_mode', 3, False), ('coordinate_transformation_mode', 3, False), ('cubic_coeff_a', 1, False), ('mode', 3, False)),
        13: (('extrapolation_value', 1, False), ('exclude_outside', 2, False), ('nearest_mode', 3, False), ('coordinate_transformation_mode', 3, False), ('cubic_coeff_a', 1, False), ('mode', 3, False)),
        18: (('keep_aspect_ratio_policy', 3, False), ('axes', 7, False), ('antialias', 2, False), ('extrapolation_value', 1, False), ('exclude_outside', 2, False), ('nearest_mode', 3, False), ('coordinate_transformation_mode', 3, False), ('cubic_coeff_a', 1, False), ('mode', 3, False)),
        19: (('keep_aspect_ratio_policy', 3, False), ('axes', 7, False), ('antialias', 2, False), ('extrapolation_value', 1, False), ('exclude_outside', 2, False), ('nearest_mode', 3, False), ('coordinate_transformation_mode', 3, False), ('cubic_coeff_a', 1, False), ('mode', 3, False)),
    },
    ('', 'ReverseSequence'): {
        10: (('batch_axis', 2, False), ('time_axis', 2, False)),
        28: (('batch_axis', 2, False), ('time_axis', 2, False)),
    },
    ('', 'RoiAlign'): {
        10: (('mode', 3, False), ('output_height', 2, False), ('sampling_ratio', 2, False), ('output_width', 2, False), ('spatial_scale', 1, False)),
        16: (('coordinate_transformation_mode', 3, False), ('mode', 3, False), ('output_height', 2, False), ('sampling_ratio', 2, False), ('output_width', 2, False), ('spatial_scale', 1, False)),
        22: (('coordinate_transformation_mode', 3, False), ('mode', 3, False), ('output_height', 2, False), ('sampling_ratio', 2, False), ('output_width', 2, False), ('spatial_scale', 1, False)),
    },
    ('', 'RotaryEmbedding'): {
        23: (('num_heads', 2, False), ('rotary_embedding_dim', 2, False), ('interleaved', 2, False)),
    },
    ('', 'Round'): {
        11: (),
        22: (),
    },
    ('', 'STFT'): {
        17: (('onesided', 2, False),),
    },
    ('', 'Scan'): {
        8: (('directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        9: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        11: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        16: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        19: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        21: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        23: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        24: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
        25: (('scan_input_axes', 7, False), ('scan_output_axes', 7, False), ('scan_output_directions', 7, False), ('scan_input_directions', 7, False), ('num_scan_inputs', 2, True), ('body', 5, True)),
    },
    ('', 'Scatter'): {
        9: (('axis', 2, False),),
        11: (('axis', 2, False),),
    },
    ('', 'ScatterElements'): {
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
        16: (('reduction', 3, False), ('axis', 2, False)),
        18: (('reduction', 3, False), ('axis', 2, False)),
    },
    ('', 'ScatterND'): {
        11: (),
        13: (),
        16: (('reduction', 3, False),),
        18: (('reduction', 3, False),),
    },
    ('', 'Selu'): {
        1: (('consumed_inputs', 7, False), ('gamma', 1, False), ('alpha', 1, False)),
        6: (('gamma', 1, False), ('alpha', 1, False)),
        22: (('gamma', 1, False), ('alpha', 1, False)),
    },
    ('', 'SequenceAt'): {
        11: (),
    },
    ('', 'SequenceConstruct'): {
        11: (),
    },
    ('', 'SequenceEmpty'): {
        11: (('dtype', 2, False),),
    },
    ('', 'SequenceErase'): {
        11: (),
    },
    ('', 'SequenceInsert'): {
        11: (),
    },
    ('', 'SequenceLength'): {
        11: (),
    },
    ('', 'SequenceMap'): {
        17: (('body', 5, True),),
    },
    ('', 'Shape'): {
        1: (),
        13: (),
        15: (('end', 2, False), ('start', 2, False)),
        19: (('end', 2, False), ('start', 2, False)),
        21: (('end', 2, False), ('start', 2, False)),
        23: (('end', 2, False), ('start', 2, False)),
        24: (('end', 2, False), ('start', 2, False)),
        25: (('end', 2, False), ('start', 2, False)),
    },
    ('', 'Shrink'): {
        9: (('bias', 1, False), ('lambd', 1, False)),
    },
    ('', 'Sigmoid'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'Sign'): {
        9: (),
        13: (),
    },
    ('', 'Sin'): {
        7: (),
        22: (),
    },
    ('', 'Sinh'): {
        9: (),
        22: (),
    },
    ('', 'Size'): {
        1: (),
        13: (),
        19: (),
        21: (),
        23: (),
        24: (),
        25: (),
    },
    ('', 'Slice'): {
        1: (('ends', 7, True), ('starts', 7, True), ('axes', 7, False)),
        10: (),
        11: (),
        13: (),
    },
    ('', 'Softmax'): {
        1: (('axis', 2, False),),
        11: (('axis', 2, False),),
        13: (('axis', 2, False),),
    },
    ('', 'SoftmaxCrossEntropyLoss'): {
        12: (('ignore_index', 2, False), ('reduction', 3, False)),
        13: (('ignore_index', 2, False), ('reduction', 3, False)),
    },
    ('', 'Softplus'): {
        1: (),
        22: (),
    },
    ('', 'Softsign'): {
        1: (),
        22: (),
    },
    ('', 'SpaceToDepth'): {
        1: (('blocksize', 2, True),),
        13: (('blocksize', 2, True),),
        28: (('mode', 3, False), ('blocksize', 2, True)),
    },
    ('', 'Split'): {
        1: (('split', 7, False), ('axis', 2, False)),
        2: (('split', 7, False), ('axis', 2, False)),
        11: (('split', 7, False), ('axis', 2, False)),
        13: (('axis', 2, False),),
        18: (('num_outputs', 2, False), ('axis', 2, False)),
    },
    ('', 'SplitToSequence'): {
        11: (('keepdims', 2, False), ('axis', 2, False)),
        24: (('keepdims', 2, False), ('axis', 2, False)),
    },
    ('', 'Sqrt'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'Squeeze'): {
        1: (('axes', 7, False),),
        11: (('axes', 7, False),),
        13: (),
        21: (),
        23: (),
        24: (),
        25: (),
    },
    ('', 'StringConcat'): {
        20: (),
    },
    ('', 'StringNormalizer'): {
        10: (('stopwords', 8, False), ('locale', 3, False), ('is_case_sensitive', 2, False), ('case_change_action', 3, False)),
    },
    ('', 'StringSplit'): {
        20: (('maxsplit', 2, False), ('delimiter', 3, False)),
    },
    ('', 'Sub'): {
        1: (('axis', 2, False), ('consumed_inputs', 7, False), ('broadcast', 2, False)),
        6: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
        13: (),
        14: (),
    },
    ('', 'Sum'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        8: (),
        13: (),
    },
    ('', 'SwiGLU'): {
        28: (('alpha', 1, False),),
    },
    ('', 'Swish'): {
        24: (('alpha', 1, False),),
    },
    ('', 'Tan'): {
        7: (),
        22: (),
    },
    ('', 'Tanh'): {
        1: (('consumed_inputs', 7, False),),
        6: (),
        13: (),
    },
    ('', 'TensorScatter'): {
        24: (('mode', 3, False), ('axis', 2, False)),
    },
    ('', 'TfIdfVectorizer'): {
        9: (('mode', 3, True), ('ngram_indexes', 7, True), ('weights', 6, False), ('ngram_counts', 7, True), ('pool_int64s', 7, False), ('pool_strings', 8, False), ('max_skip_count', 2, True), ('min_gram_length', 2, True), ('max_gram_length', 2, True)),
    },
    ('', 'ThresholdedRelu'): {
        10: (('alpha', 1, False),),
        22: (('alpha', 1, False),),
    },
    ('', 'Tile'): {
        1: (),
        6: (),
        13: (),
    },
    ('', 'TopK'): {
        1: (('axis', 2, False), ('k', 2, True)),
        10: (('axis', 2, False),),
        11: (('sorted', 2, False), ('largest', 2, False), ('axis', 2, False)),
        24: (('sorted', 2, False), ('largest', 2, False), ('axis', 2, False)),
    },
    ('', 'Transpose'): {
        1: (('perm', 7, False),),
        13: (('perm', 7, False),),
        21: (('perm', 7, False),),
        23: (('perm', 7, False),),
        24: (('perm', 7, False),),
        25: (('perm', 7, False),),
    },
    ('', 'Trilu'): {
        14: (('upper', 2, False),),
    },
    ('', 'Unique'): {
        11: (('axis', 2, False), ('sorted', 2, False)),
        28: (('axis', 2, False), ('sorted', 2, False)),
    },
    ('', 'Unsqueeze'): {
        1: (('axes', 7, True),),
        11: (('axes', 7, True),),
        13: (),
        21: (),
        23: (),
        24: (),
        25: (),
    },
    ('', 'Upsample'): {
        1: (('mode', 3, False), ('height_scale', 1, True), ('width_scale', 1, True)),
        7: (('mode', 3, False), ('scales', 6, True)),
        9: (('mode', 3, False),),
        10: (('mode', 3, False),),
    },
    ('', 'Where'): {
        9: (),
        16: (),
    },
    ('', 'Xor'): {
        1: (('axis', 2, False), ('broadcast', 2, False)),
        7: (),
    },
    ('ai.onnx.ml', 'ArrayFeatureExtractor'): {
        1: (),
    },
    ('ai.onnx.ml', 'Binarizer'): {
        1: (('threshold', 1, False),),
    },
    ('ai.onnx.ml', 'CastMap'): {
        1: (('max_map', 2, False), ('map_form', 3, False), ('cast_to', 3, False)),
    },
    ('ai.onnx.ml', 'CategoryMapper'): {
        1: (('default_int64', 2, False), ('default_string', 3, False), ('cats_int64s', 7, False), ('cats_strings', 8, False)),
    },
    ('ai.onnx.ml', 'DictVectorizer'): {
        1: (('int64_vocabulary', 7, False), ('string_vocabulary', 8, False)),
    },
    ('ai.onnx.ml', 'FeatureVectorizer'): {
        1: (('inputdimensions', 7, False),),
    },
    ('ai.onnx.ml', 'Imputer'): {
        1: (('replaced_value_int64', 2, False), ('imputed_value_int64s', 7, False), ('replaced_value_float', 1, False), ('imputed_value_floats', 6, False)),
    },
    ('ai.onnx.ml', 'LabelEncoder'): {
        1: (('default_string', 3, False), ('default_int64', 2, False), ('classes_strings', 8, False)),
        2: (('default_int64', 2, False), ('default_float', 1, False), ('default_string', 3, False), ('values_int64s', 7, False), ('values_strings', 8, False), ('keys_floats', 6, False), ('values_floats', 6, False), ('keys_int64s', 7, False), ('keys_strings', 8, False)),
        4: (('default_tensor', 4, False), ('default_int64', 2, False), ('default_float', 1, False), ('default_string', 3, False), ('values_int64s', 7, False), ('values_strings', 8, False), ('values_tensor', 4, False), ('keys_floats', 6, False), ('keys_strings', 8, False), ('values_floats', 6, False), ('keys_int64s', 7, False), ('keys_tensor', 4, False)),
    },
    ('ai.onnx.ml', 'LinearClassifier'): {
        1: (('post_transform', 3, False), ('classlabels_ints', 7, False), ('classlabels_strings', 8, False), ('multi_class', 2, False), ('intercepts', 6, False), ('coefficients', 6, True)),
    },
    ('ai.onnx.ml', 'LinearRegressor'): {
        1: (('targets', 2, False), ('intercepts', 6, False), ('coefficients', 6, False), ('post_transform', 3, False)),
    },
    ('ai.onnx.ml', 'Normalizer'): {
        1: (('norm', 3, False),),
    },
    ('ai.onnx.ml', 'OneHotEncoder'): {
        1: (('zeros', 2, False), ('cats_strings', 8, False), ('cats_int64s', 7, False)),
    },
    ('ai.onnx.ml', 'SVMClassifier'): {
        1: (('classlabels_ints', 7, False), ('rho', 6, False), ('prob_b', 6, False), ('coefficients', 6, False), ('classlabels_strings', 8, False), ('prob_a', 6, False), ('support_vectors', 6, False), ('vectors_per_class', 7, False), ('post_transform', 3, False), ('kernel_params', 6, False), ('kernel_type', 3, False)),
    },
    ('ai.onnx.ml', 'SVMRegressor'): {
        1: (('rho', 6, False), ('coefficients', 6, False), ('n_supports', 2, False), ('one_class', 2, False), ('support_vectors', 6, False), ('post_transform', 3, False), ('kernel_params', 6, False), ('kernel_type', 3, False)),
    },
    ('ai.onnx.ml', 'Scaler'): {
        1: (('scale', 6, False), ('offset', 6, False)),
    },
    ('ai.onnx.ml', 'TreeEnsemble'): {
        5: (('aggregate_function', 2, False), ('post_transform', 2, False), ('tree_roots', 7, True), ('nodes_hitrates', 4, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_modes', 4, True), ('leaf_weights', 4, True), ('leaf_targetids', 7, True), ('nodes_falsenodeids', 7, True), ('n_targets', 2, False), ('nodes_trueleafs', 7, True), ('nodes_featureids', 7, True), ('nodes_splits', 4, True), ('nodes_falseleafs', 7, True), ('nodes_truenodeids', 7, True), ('membership_values', 4, False)),
    },
    ('ai.onnx.ml', 'TreeEnsembleClassifier'): {
        1: (('post_transform', 3, False), ('classlabels_int64s', 7, False), ('nodes_nodeids', 7, False), ('classlabels_strings', 8, False), ('class_ids', 7, False), ('class_weights', 6, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('nodes_values', 6, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('class_treeids', 7, False), ('class_nodeids', 7, False)),
        3: (('base_values_as_tensor', 4, False), ('post_transform', 3, False), ('classlabels_int64s', 7, False), ('class_weights_as_tensor', 4, False), ('class_weights', 6, False), ('classlabels_strings', 8, False), ('class_ids', 7, False), ('nodes_nodeids', 7, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('nodes_values_as_tensor', 4, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_values', 6, False), ('nodes_hitrates_as_tensor', 4, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('class_treeids', 7, False), ('class_nodeids', 7, False)),
        5: (('base_values_as_tensor', 4, False), ('post_transform', 3, False), ('classlabels_int64s', 7, False), ('class_weights_as_tensor', 4, False), ('class_weights', 6, False), ('classlabels_strings', 8, False), ('class_ids', 7, False), ('nodes_nodeids', 7, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('nodes_values_as_tensor', 4, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_values', 6, False), ('nodes_hitrates_as_tensor', 4, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('class_treeids', 7, False), ('class_nodeids', 7, False)),
    },
    ('ai.onnx.ml', 'TreeEnsembleRegressor'): {
        1: (('aggregate_function', 3, False), ('post_transform', 3, False), ('n_targets', 2, False), ('nodes_nodeids', 7, False), ('target_nodeids', 7, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('nodes_values', 6, False), ('target_weights', 6, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('target_treeids', 7, False), ('target_ids', 7, False)),
        3: (('base_values_as_tensor', 4, False), ('aggregate_function', 3, False), ('post_transform', 3, False), ('n_targets', 2, False), ('target_weights_as_tensor', 4, False), ('target_ids', 7, False), ('nodes_nodeids', 7, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('target_nodeids', 7, False), ('nodes_values_as_tensor', 4, False), ('target_weights', 6, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_values', 6, False), ('nodes_hitrates_as_tensor', 4, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('target_treeids', 7, False)),
        5: (('base_values_as_tensor', 4, False), ('aggregate_function', 3, False), ('post_transform', 3, False), ('n_targets', 2, False), ('target_weights_as_tensor', 4, False), ('target_ids', 7, False), ('nodes_nodeids', 7, False), ('nodes_treeids', 7, False), ('nodes_featureids', 7, False), ('target_nodeids', 7, False), ('nodes_values_as_tensor', 4, False), ('target_weights', 6, False), ('nodes_falsenodeids', 7, False), ('nodes_hitrates', 6, False), ('base_values', 6, False), ('nodes_missing_value_tracks_true', 7, False), ('nodes_values', 6, False), ('nodes_hitrates_as_tensor', 4, False), ('nodes_modes', 8, False), ('nodes_truenodeids', 7, False), ('target_treeids', 7, False)),
    },
    ('ai.onnx.ml', 'ZipMap'): {
        1: (('classlabels_int64s', 7, False), ('classlabels_strings', 8, False)),
    },
    ('ai.onnx.preview', 'FlexAttention'): {
        1: (('prob_mod', 5, False), ('score_mod', 5, False), ('softmax_precision', 2, False), ('scale', 1, False)),
    },
    ('ai.onnx.preview.training', 'Adagrad'): {
        1: (('norm_coefficient', 1, False), ('decay_factor', 1, False), ('epsilon', 1, False)),
    },
    ('ai.onnx.preview.training', 'Adam'): {
        1: (('epsilon', 1, False), ('norm_coefficient_post', 1, False), ('norm_coefficient', 1, False), ('beta', 1, False), ('alpha', 1, False)),
    },
    ('ai.onnx.preview.training', 'Gradient'): {
        1: (('y', 3, True), ('zs', 8, False), ('xs', 8, True)),
    },
    ('ai.onnx.preview.training', 'Momentum'): {
        1: (('norm_coefficient', 1, True), ('beta', 1, True), ('mode', 3, True), ('alpha', 1, True)),
    },
}
